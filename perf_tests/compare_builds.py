#!/usr/bin/env python3
"""Two longattn-train builds on the same run, alternated: step time, losses, memory, and the time
of each kernel class per step (a before-and-after measurement of a change).

Runs `BEFORE` and `AFTER` (longattn-train binaries) with the same options `--repeat` times,
alternating, and prints for each the median step after the first of every repeat, whether the
losses are the same doubles, the pool's high-water, and the seconds per step of each kernel class
of the planner (element_costs.py's classes, timed through the kernel_times Kokkos Tools library
of the AFTER build's tree) with the kernel count per step; "products' copies" are the Kokkos
kernels of 16-bit matrix products (operand copies; BLAS's own time is not a Kokkos kernel).
Options after `--` go to both.

  compare_builds.py BEFORE AFTER [--ranks 1] [--steps 5] [--repeat 3] -- --precision bf16 ...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from element_costs import CLASSES, element_class

TIMED_PHASES = ["forward", "backward", "gradient reduction", "optimizer"]


def run(program, ranks, args, kernel_times):
    """The trainer's JSON and {class: (seconds, kernels)} summed over the timed steps, on rank 0."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   KOKKOS_PROFILE_LIBRARY=kernel_times, LONGATTN_KERNEL_TIMES=os.path.join(tmp, "times-%p.json"))
        command = [program, "--quiet", "--eval-every", "0", "--peak-gflops", "1", "--json", summary] + args
        if ranks > 1:
            command = ["mpiexec", "-n", str(ranks), "--oversubscribe", "-x", "KOKKOS_PROFILE_LIBRARY",
                       "-x", "LONGATTN_KERNEL_TIMES"] + command
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
        with open(summary) as f:
            trainer = json.load(f)
        classes = {cls: [0.0, 0] for cls in CLASSES + ["attention", "products' copies"]}
        first = sorted(f for f in os.listdir(tmp) if f.startswith("times-"))[0]
        with open(os.path.join(tmp, first)) as f:
            regions = json.load(f)["regions"]
        for phase in TIMED_PHASES:
            for name, t in regions.get("longattn-train: " + phase, {}).items():
                cls = element_class(name, phase) or "products' copies"
                classes[cls][0] += t["seconds"]
                classes[cls][1] += t["calls"]
    return trainer, classes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="-- then longattn-train options")
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="steps per run (the first is not timed)")
    parser.add_argument("--repeat", type=int, default=3)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    kernel_times = os.path.join(os.path.dirname(os.path.abspath(options.after)), "../../perf_tests/liblongattn_kernel_times.so")
    if not os.path.exists(kernel_times):
        sys.exit(f"compare_builds.py: no {kernel_times}: build the AFTER tree's longattn_kernel_times target")
    args = ["--steps", str(options.steps)] + argv[split + 1:]
    sides = {"before": options.before, "after": options.after}
    steps, losses, memory, classes = ({s: [] for s in sides} for _ in range(4))
    for _ in range(options.repeat):
        for side, program in sides.items():
            trainer, by_class = run(program, options.ranks, args, kernel_times)
            steps[side].append(statistics.median(s["seconds"] for s in trainer["steps"][1:]))
            losses[side].append([s["loss"] for s in trainer["steps"]])
            memory[side].append(trainer["summary"]["memory_bytes"])
            classes[side].append(by_class)
    print(f"longattn-train {' '.join(args)} on {options.ranks} rank(s), {options.repeat} alternated runs each")
    for side in sides:
        print(f"{side:6s} median step {', '.join(f'{s:.4f}' for s in steps[side])} s; pool high-water "
              f"{memory[side][0] / 2**20:.1f} MiB; losses {' '.join(f'{l:.6f}' for l in losses[side][0])}")
    print("same losses (doubles): " + str(losses["before"][0] == losses["after"][0]))
    print(f"\nseconds per step by kernel class over all {options.steps} steps (median of the runs; kernels per step), before -> after:")
    for cls in CLASSES + ["attention", "products' copies"]:
        row = []
        for side in sides:
            seconds = statistics.median(c[cls][0] for c in classes[side]) / (options.steps)
            calls = classes[side][0][cls][1] / options.steps
            row.append(f"{seconds * 1e3:8.2f} ms ({calls:5.0f})")
        print(f"  {cls:16s} {row[0]} -> {row[1]}")


if __name__ == "__main__":
    main()
