#!/usr/bin/env python3
"""longattn-train's step time and memory for each precision, recomputation mode, micro-batch and
gradient all-reduce precision.

Runs `longattn-train --precision P --recompute R --micro-batch M --grad-reduce G` for every P, R,
M and G given, on
the same model and ranks, alternating the configurations `--repeat` times, and prints a Markdown
table: the median step after the first (best of the repeats), the pool's high-water mark per
rank, the model's state (parameters, gradients, AdamW moments, and a 16-bit model's fp32 master
weights), the activations (the high-water mark beyond that state and the gradient buckets'
buffers: activations and workspaces) and those against `--recompute none` at the same precision
and micro-batch size, and the share of the step spent communicating (gradient all-reduce, ring
waits). Options after `--` go to longattn-train unchanged (model size, attention, --cp, ...).

  train_modes.py build/test/apps/train/longattn-train [--ranks 2] [--steps 4] [--repeat 2]
      [--precision fp32] [--recompute none,selective,full] [--micro-batch 0] [--grad-reduce fp32]
      -- --batch 16 ...
"""
import argparse
import statistics
import sys

from train_runs import run_training


def run(program, ranks, precision, recompute, micro_batch, grad_reduce, args):
    return run_training(program, ranks, ["--precision", precision, "--recompute", recompute,
                                         "--micro-batch", str(micro_batch), "--grad-reduce", grad_reduce] + args,
                        "train_modes.py")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="-- then longattn-train options")
    parser.add_argument("program", help="the longattn-train binary")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="steps per run (the first is not timed)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--precision", default="fp32", help="comma-separated: fp32, bf16, fp16")
    parser.add_argument("--recompute", default="none,selective,full")
    parser.add_argument("--micro-batch", default="0", help="comma-separated sizes (0: the whole batch / dp)")
    parser.add_argument("--grad-reduce", default="fp32", help="comma-separated: fp32, model")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    if options.steps < 2:
        sys.exit("train_modes.py: --steps must be at least 2 (the first step is not timed)")
    args = ["--steps", str(options.steps)] + argv[split + 1:]
    configs = [(p, r, int(m), g) for p in options.precision.split(",") for g in options.grad_reduce.split(",")
               for m in options.micro_batch.split(",") for r in options.recompute.split(",")]
    seconds = {c: [] for c in configs}
    report = {}
    for _ in range(options.repeat):
        for c in configs:
            report[c] = run(options.program, options.ranks, *c, args)
            seconds[c].append(statistics.median(s["seconds"] for s in report[c]["steps"][1:]))

    first = report[configs[0]]
    print(f"{first['parameters']} parameters, {first['flops_per_step'] * 1e-9:.2f} GFLOP per step, "
          f"grid dp {first['grid']['dp']} x cp {first['grid']['cp']}; gradient buckets "
          f"{first['bucket_bytes'] / 2**20:.1f} MiB per rank; longattn-train {' '.join(args)}\n")
    print("| precision | grad reduce | recompute | micro-batch | s/step | GFLOP/s | comm | pool high-water MiB "
          "| model state MiB | activations MiB | vs none |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in configs:
        r = report[c]
        best = min(seconds[c])
        activations = r["summary"]["activation_bytes"]
        none = report.get((c[0], "none", c[2], c[3]))
        ratio = f"{activations / none['summary']['activation_bytes']:.2f}" if none else "-"
        grad_reduce = c[0] if c[3] == "model" else "fp32"
        print(f"| {c[0]} | {grad_reduce} | {c[1]} | {r['config']['micro_batch']} | {best:.3f} | "
              f"{r['flops_per_step'] / best * 1e-9:.1f} | {100 * r['summary']['steady_communication_share']:.1f}% | "
              f"{r['summary']['memory_bytes'] / 2**20:.1f} | {r['model_state_bytes'] / 2**20:.1f} | "
              f"{activations / 2**20:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
