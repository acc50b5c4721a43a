#!/usr/bin/env python3
"""longattn-train's own kernels, timed for the planner: the cost per element of the kernels that
are neither matrix products nor attention, by the planner's classes (plan::ElementClass), and
dense attention's efficiency by head dimension, in each precision.

Runs longattn-train on one rank of one thread for 2 and for 12 steps of fixed models (E 128,
head dimensions 16-128; dilated and block-sparse attention and a ring of 2 ranks at 64) under the
kernel_times Kokkos Tools library (perf_tests/kernel_times.cpp),
sorts each kernel timed inside a step's phases into a class by its name (or its phase: the
optimizer's), takes the difference of the two runs (10 steps, without the first step's page
faults and the start-up) and divides each class's time by the elements the planner counts for it
in those steps (the trainer's JSON, "predicted_elements"): a cost is the time of that many FLOPs
at one core's peak (seconds x peak FLOP/s per element), as plan::ElementCosts reads it. The
attention kernels' time against the planner's attention FLOPs ("predicted_attention_flops") gives
the fraction of the peak they reach at that head dimension, and the other kinds' (and the ring's)
against dense attention's.

    perf_tests/element_costs.py BUILD_DIR [PEAK_GFLOPS_ONE_CORE]

prints both as JSON (write_calibration.py calls measure_trainer_kernels). Without the peak it
measures one with longattn-info.
"""
import json
import os
import subprocess
import sys
import tempfile

CLASSES = ["norm_forward", "norm_backward", "gelu_forward", "gelu_backward", "rows", "loss", "optimizer"]
STEP_PHASES = ["forward", "backward", "optimizer"]


# The calibration models: E 128 with 8, 4, 2 or 1 heads (head dimension 16-128), 512 tokens, 4
# sequences; a second or two a run. The element costs come from the 2-head one.
def model(heads):
    return ["--layers", "2", "--embed", "128", "--heads", str(heads), "--context", "512", "--batch", "4",
            "--task", "long_range"]


HEADS = [8, 4, 2, 1]
ELEMENT_HEADS = 2
STEPS = (2, 12)


def element_class(name, phase):
    """The planner's class of a kernel, "attention", or None for matrix products (with their
    operand copies, which the products' table measures)."""
    if phase == "optimizer":
        return "optimizer"
    if name.startswith("longattn::gemm(") or name == "longattn::convert":
        return None
    if (name.startswith("longattn::attention") or "BlockSparseLayout" in name or name.startswith("longattn::top_k_layout")
            or name.startswith("longattn::merge_partial") or name.startswith("longattn::dilated")):
        return "attention"
    for prefix, cls in [("longattn::layer_norm_forward", "norm_forward"), ("longattn::layer_norm_backward", "norm_backward"),
                        ("longattn::train::gelu_forward", "gelu_forward"),
                        ("longattn::train::gelu_backward", "gelu_backward"), ("longattn::train::cross_entropy", "loss")]:
        if name.startswith(prefix):
            return cls
    return "rows"  # residual and bias adds, bias gradients, embeddings, fills


def timed_run(build, precision, steps, env, heads=ELEMENT_HEADS, options=(), ranks=1):
    """(seconds by class and "attention" on a rank, averaged over ranks; the trainer's JSON) of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        run_env = dict(env, OMP_NUM_THREADS="1", OMP_PROC_BIND="false", OMPI_ALLOW_RUN_AS_ROOT="1",
                       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       KOKKOS_PROFILE_LIBRARY=os.path.join(build, "perf_tests/liblongattn_kernel_times.so"),
                       LONGATTN_KERNEL_TIMES=os.path.join(tmp, "times-%p.json"))
        command = [os.path.join(build, "apps/train/longattn-train"), "--quiet", "--eval-every", "0", "--peak-gflops", "1",
                   "--steps", str(steps), "--precision", precision, "--json", summary] + model(heads) + list(options)
        if ranks > 1:
            command = ["mpiexec", "-n", str(ranks), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS",
                       "-x", "OMP_PROC_BIND", "-x", "KOKKOS_PROFILE_LIBRARY", "-x", "LONGATTN_KERNEL_TIMES"] + command
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=run_env)
        seconds = dict.fromkeys(CLASSES + ["attention"], 0.0)
        files = [f for f in os.listdir(tmp) if f.startswith("times-")]
        for file in files:
            with open(os.path.join(tmp, file)) as f:
                regions = json.load(f)["regions"]
            for phase in STEP_PHASES:
                for name, t in regions.get("longattn-train: " + phase, {}).items():
                    cls = element_class(name, phase)
                    if cls:
                        seconds[cls] += t["seconds"] / len(files)
        with open(summary) as f:
            trainer = json.load(f)
    return seconds, trainer


def per_step(build, precision, env, **run):
    """Seconds by class and "attention" in one step (the two runs' difference), and the trainer's JSON."""
    (short, trainer), (long, _) = (timed_run(build, precision, steps, env, **run) for steps in STEPS)
    return {cls: max(0.0, long[cls] - short[cls]) / (STEPS[1] - STEPS[0]) for cls in long}, trainer


# The other kinds and the ring, each against dense attention at head dimension 64 (E 128, 2 heads).
KINDS = {"dilated": {"options": ["--attention", "dilated:w=128,256,512;r=1,2,4"]},
         "block_sparse": {"options": ["--attention", "block_sparse:pattern=local_window;radius=128"]},
         "ring": {"options": ["--cp", "2"], "ranks": 2}}


def measure_trainer_kernels(build, core_peak_gflops, env=None):
    """The element costs {"fp32": {class: cost}, "bf16": ..., "fp16": ...}, dense attention by head
    dimension {"fp32": [[head dim, efficiency], ...], ...} and the kinds' and the ring's factors
    against dense attention {"fp32": {"dilated": f, "block_sparse": f, "ring": f}, ...}."""
    env = dict(env or os.environ)
    peak = core_peak_gflops * 1e9

    def efficiency(seconds, trainer):
        return trainer["predicted_attention_flops"] / (seconds["attention"] * peak)

    costs, by_head_dim, factors = {}, {}, {}
    for precision in ["fp32", "bf16", "fp16"]:
        by_head_dim[precision] = []
        for heads in HEADS:
            seconds, trainer = per_step(build, precision, env, heads=heads)
            by_head_dim[precision].append([128 // heads, round(efficiency(seconds, trainer), 4)])
            if heads == ELEMENT_HEADS:
                dense = efficiency(seconds, trainer)
                elements = trainer["predicted_elements"]
                costs[precision] = {cls: round(seconds[cls] / elements[cls] * peak, 3) if elements[cls] > 0 else 0.0
                                    for cls in CLASSES}
        factors[precision] = {kind: round(efficiency(*per_step(build, precision, env, **run)) / dense, 4)
                              for kind, run in KINDS.items()}
    return costs, by_head_dim, factors


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    build = sys.argv[1]
    if len(sys.argv) == 3:
        peak = float(sys.argv[2])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            info = os.path.join(tmp, "info.json")
            subprocess.run([os.path.join(build, "apps/info/longattn-info"), "--json", info], check=True,
                           stdout=subprocess.DEVNULL)
            with open(info) as f:
                peak = json.load(f)["ceilings"]["fp32_fma_peak_one_core"]["gflops"]
    costs, by_head_dim, factors = measure_trainer_kernels(build, peak)
    print(json.dumps({"element_costs": costs, "attention_by_head_dim": by_head_dim, "attention_factors": factors}, indent=2))


if __name__ == "__main__":
    main()
