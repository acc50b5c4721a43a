"""Checks a longattn-train run's JSON summary (--json) against a target; exits 1 naming what missed.

  check_train_run.py RUN.json [--loss-falls DROP] [--memory-within FRACTION]

--loss-falls DROP: the mean loss of the last two steps at least DROP below the first step's.
--memory-within FRACTION: the pool's high-water within FRACTION of the planner's prediction
(issue 47: 0.10).
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a longattn-train --json file")
    parser.add_argument("--loss-falls", type=float, metavar="DROP",
                        help="the last two steps' mean loss at least DROP below the first step's")
    parser.add_argument("--memory-within", type=float, metavar="FRACTION",
                        help="measured high-water / predicted memory within 1 +- FRACTION")
    args = parser.parse_args()
    if args.loss_falls is None and args.memory_within is None:
        parser.error("name a target: --loss-falls and/or --memory-within")
    with open(args.run) as f:
        run = json.load(f)

    misses = []
    if args.loss_falls is not None:
        losses = [s["loss"] for s in run["steps"] if not s["skipped"]]
        if len(losses) < 3:
            misses.append(f"--loss-falls needs 3 or more steps, the run has {len(losses)}")
        else:
            last = sum(losses[-2:]) / 2
            print(f"loss: first step {losses[0]:.4f}, last two steps' mean {last:.4f} "
                  f"(fall {losses[0] - last:.4f}, wanted at least {args.loss_falls})")
            if not losses[0] - last >= args.loss_falls:
                misses.append(f"the loss fell by {losses[0] - last:.4f}, less than {args.loss_falls}")
    if args.memory_within is not None:
        measured, predicted = run["summary"]["memory_bytes"], run["predicted_memory_bytes"]
        if not predicted:
            misses.append("the run has no planner prediction (predicted_memory_bytes)")
        else:
            ratio = measured / predicted
            print(f"memory: high-water {measured / 2**20:.1f} MiB, planner {predicted / 2**20:.1f} MiB "
                  f"(measured / predicted {ratio:.3f}, wanted 1 +- {args.memory_within})")
            if abs(ratio - 1) > args.memory_within:
                misses.append(f"measured / predicted memory {ratio:.3f} is outside 1 +- {args.memory_within}")
    for miss in misses:
        print(f"{args.run}: MISSED: {miss}", file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
