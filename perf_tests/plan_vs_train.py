#!/usr/bin/env python3
"""longattn-plan's memory per rank and compute time per step against longattn-train's measured
pool high-water and step time, layout by layout.

Runs `longattn-train` for each layout (ranks, --tp, --cp, --zero, --recompute, --precision,
--micro-batch) on the same model and prints a Markdown table: the planner's prediction (the
trainer's JSON summary carries it: apps/train/include/longattn/train/prediction.hpp) and the
measurement, whole and in three parts: model state (planner: parameters + gradients + optimizer
states; trainer: model_state_bytes), communication buffers (planner's; trainer: the gradient
buckets' bucket_bytes) and the rest (planner: activations, attention workspace and backward
buffers; trainer: the
high-water mark beyond both). The issue's target: the whole within 10%.

With --calibration (perf_tests/write_calibration.py's JSON, written on this machine just before)
it also compares time: the planner's compute term (hardware FLOPs / (FMA peak x the
calibration's efficiencies); the trainer computes it: prediction.hpp) against each run's steps
after the first, less their measured communication (the planner's communication model is a GPU
cluster's links, not shared-memory MPI). Target: within 25%. Options after `--` go to
longattn-train unchanged.

  plan_vs_train.py build/test/apps/train/longattn-train [--steps 4] [--calibration calib.json] -- ...
"""
import json
import argparse
import sys

from train_runs import run_training

# ranks, then longattn-train options: dp x cp x tp, ZeRO, recomputation, precision, micro-batches.
LAYOUTS = [
    (1, []),
    (2, []),
    (2, ["--zero", "1"]),
    (2, ["--zero", "2"]),
    (2, ["--cp", "2"]),
    (4, ["--cp", "2", "--zero", "1"]),
    (2, ["--recompute", "selective"]),
    (2, ["--recompute", "full"]),
    (2, ["--precision", "bf16"]),
    (2, ["--precision", "bf16", "--zero", "1", "--recompute", "full"]),
    (2, ["--micro-batch", "2"]),
    (2, ["--tp", "2"]),
    (4, ["--tp", "2", "--zero", "1"]),
    (4, ["--zero", "2", "--micro-batch", "2"]),
    (4, ["--tp", "2", "--zero", "2"]),
    (2, ["--tp", "2", "--sequence-parallel"]),
    (4, ["--tp", "2", "--cp", "2", "--sequence-parallel"]),
    (4, ["--tp", "2", "--cp", "2", "--zero", "1"]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="-- then longattn-train options")
    parser.add_argument("program", help="the longattn-train binary")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--calibration", help="write_calibration.py's JSON: compare compute time too")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    extra = argv[split + 1:]
    mib = 1 << 20
    timed, peak = [], 1
    if options.calibration:
        with open(options.calibration) as f:
            peak = json.load(f)["fp32_fma_peak_gflops"]
        timed = ["--calibration", options.calibration]
    print("| ranks | layout | predicted MiB | measured MiB | measured / predicted | model state p / m "
          "| buffers p / m | activations and workspaces p / m |" + (" compute s/step p / m | measured / predicted "
                                                                     "| communication |" if timed else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if timed else ""))
    worst = worst_time = 0.0
    for ranks, layout in LAYOUTS:
        j = run_training(options.program, ranks, ["--steps", str(options.steps)] + extra + layout + timed,
                         "plan_vs_train.py", peak_gflops=peak)
        p = j["predicted_memory"]
        measured = j["summary"]["memory_bytes"]
        predicted = j["predicted_memory_bytes"]
        state_p = p["parameters"] + p["gradients"] + p["optimizer states"]
        rest_p = p["activations"] + p["attention workspace"] + p["backward buffers"]
        ratio = measured / predicted
        worst = max(worst, abs(ratio - 1))
        grid = j["grid"]
        name = f"dp {grid['dp']} x cp {grid['cp']} x tp {grid['tp']} " + " ".join(layout).replace("--", "")
        print(f"| {ranks} | {name.strip()} | {predicted / mib:.1f} | {measured / mib:.1f} | {ratio:.2f} "
              f"| {state_p / mib:.1f} / {j['model_state_bytes'] / mib:.1f} "
              f"| {p['communication buffers'] / mib:.1f} / {j['bucket_bytes'] / mib:.1f} "
              f"| {rest_p / mib:.1f} / {j['summary']['activation_bytes'] / mib:.1f} |", end="")
        if timed:
            p_time, m_time = j["predicted_compute_seconds"], j["summary"]["steady_compute_seconds"]
            worst_time = max(worst_time, abs(m_time / p_time - 1))
            print(f" {p_time:.3f} / {m_time:.3f} | {m_time / p_time:.2f} "
                  f"| {100 * j['summary']['steady_communication_share']:.0f}% |", end="")
        print(flush=True)
    print(f"\nlargest memory miss: {100 * worst:.0f}% (target: 10%)")
    if timed:
        print(f"largest compute-time miss: {100 * worst_time:.0f}% (target: 25%)")


if __name__ == "__main__":
    main()
