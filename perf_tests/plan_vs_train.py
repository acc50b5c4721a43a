#!/usr/bin/env python3
"""longattn-plan's memory per rank against longattn-train's measured pool high-water, layout by
layout.

Runs `longattn-train` for each layout (ranks, --cp, --zero, --recompute, --precision,
--micro-batch) on the same model and prints a Markdown table: the planner's prediction (the
trainer's JSON summary carries it: apps/train/include/longattn/train/prediction.hpp) and the
measurement, whole and in three parts: model state (planner: parameters + gradients + optimizer
states; trainer: model_state_bytes), communication buffers (planner's; trainer: the gradient
buckets' bucket_bytes) and the rest (planner: activations, attention workspace and backward
buffers; trainer: the
high-water mark beyond both). The issue's target: the whole within 10%. Options after `--` go to
longattn-train unchanged.

  plan_vs_train.py build/test/apps/train/longattn-train [--steps 2] -- --layers 4 ...
"""
import argparse
import sys

from train_runs import run_training

# ranks, then longattn-train options: dp x cp, ZeRO, recomputation, precision, micro-batches.
LAYOUTS = [
    (1, []),
    (2, []),
    (2, ["--zero", "1"]),
    (2, ["--cp", "2"]),
    (4, ["--cp", "2", "--zero", "1"]),
    (2, ["--recompute", "selective"]),
    (2, ["--recompute", "full"]),
    (2, ["--precision", "bf16"]),
    (2, ["--precision", "bf16", "--zero", "1", "--recompute", "full"]),
    (2, ["--micro-batch", "2"]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="-- then longattn-train options")
    parser.add_argument("program", help="the longattn-train binary")
    parser.add_argument("--steps", type=int, default=2)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    extra = argv[split + 1:]
    mib = 1 << 20
    print("| ranks | layout | predicted MiB | measured MiB | measured / predicted | model state p / m "
          "| buffers p / m | activations and workspaces p / m |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for ranks, layout in LAYOUTS:
        j = run_training(options.program, ranks, ["--steps", str(options.steps)] + extra + layout, "plan_vs_train.py")
        p = j["predicted_memory"]
        measured = j["summary"]["memory_bytes"]
        predicted = j["predicted_memory_bytes"]
        state_p = p["parameters"] + p["gradients"] + p["optimizer states"]
        rest_p = p["activations"] + p["attention workspace"] + p["backward buffers"]
        ratio = measured / predicted
        worst = max(worst, abs(ratio - 1))
        grid = j["grid"]
        name = f"dp {grid['dp']} x cp {grid['cp']} " + " ".join(layout).replace("--", "")
        print(f"| {ranks} | {name.strip()} | {predicted / mib:.1f} | {measured / mib:.1f} | {ratio:.2f} "
              f"| {state_p / mib:.1f} / {j['model_state_bytes'] / mib:.1f} "
              f"| {p['communication buffers'] / mib:.1f} / {j['bucket_bytes'] / mib:.1f} "
              f"| {rest_p / mib:.1f} / {j['summary']['activation_bytes'] / mib:.1f} |", flush=True)
    print(f"\nlargest miss: {100 * worst:.0f}% (target: 10%)")


if __name__ == "__main__":
    main()
