#!/usr/bin/env python3
"""longattn-train's own kernels, timed for the planner: the cost per element of the kernels that
are neither matrix products nor attention, by the planner's classes (plan::ElementClass), and
dense attention's efficiency by head dimension and by sequence length, in each precision.

Runs longattn-train on one rank of one thread (a copy on every core at once) for 2 and for 12
steps of fixed models (E 128, head dimensions 8-256; at 64, sequences of 64-2048 tokens, dilated
and block-sparse attention, and rings of 2 ranks) under the kernel_times Kokkos Tools library
(perf_tests/kernel_times.cpp), sorts each kernel timed inside a step's phases into a class by its
name (or its phase: the optimizer's), takes the difference of the two runs (10 steps, without the
first step's page faults and the start-up; each run the fastest of three) and divides each
class's time by the elements the planner counts for it in those steps (the trainer's JSON, "predicted_elements"): a cost is the time of that many FLOPs
at one core's peak (seconds x peak FLOP/s per element), as plan::ElementCosts reads it. The
attention kernels' time against the planner's attention FLOPs ("predicted_attention_flops") gives
the fraction of the peak they reach at that head dimension (512 tokens), the factor of other
lengths against it (plan::Efficiency::attention_by_length), and the other kinds' and the rings'
factors (plan::Efficiency::AttentionFactors).

    perf_tests/element_costs.py BUILD_DIR [PEAK_GFLOPS_ONE_CORE]

prints both as JSON (write_calibration.py calls measure_trainer_kernels). Without the peak it
measures one with longattn-info.
"""
import json
import os
import subprocess
import sys
import tempfile

from train_runs import run_copies

CLASSES = ["norm_forward", "norm_backward", "gelu_forward", "gelu_backward", "rows", "rotary", "loss", "optimizer"]
STEP_PHASES = ["forward", "backward", "optimizer"]


# The calibration models: 2 layers, 512 tokens, 4 sequences, rotary positions (their angles are
# an element class); a second or two a run. Dense
# attention at head dimensions 8-256 (E 128 with 16-1 heads, E 192 with 8-1, E 256 with one: the
# kernels' rate is not smooth in D, 48 runs slower than 32 or 64). The element costs come from
# E 128 with 2 heads.
def model(heads, context=512, batch=4, embed=128):
    return ["--layers", "2", "--embed", str(embed), "--heads", str(heads), "--context", str(context), "--batch",
            str(batch), "--positions", "rotary", "--task", "long_range"]


HEAD_DIMS = [(128, 16), (128, 8), (192, 8), (128, 4), (192, 4), (128, 2), (192, 2), (128, 1), (192, 1), (256, 1)]
ELEMENT_HEADS = 2
STEPS = (2, 12)
REPEATS = 3  # runs of each, the fastest taken (per_step)
# Dense attention over sequences of 64-2048 tokens at head dimension 64: one sequence of 2048
# tokens cut into segments of that length (a dilated configuration of rate 1: the same kernel on
# the segments as a batch), or dense over all 2048.
LENGTHS = [64, 128, 256, 512, 1024, 2048]


def length_run(tokens):
    return {"context": 2048, "batch": 1, "options": ["--attention", "dense" if tokens == 2048 else f"dilated:w={tokens};r=1"]}


def element_class(name, phase):
    """The planner's class of a kernel, "attention", or None for matrix products (with their
    operand copies, which the products' table measures)."""
    if phase == "optimizer":
        return "optimizer"
    if name.startswith("longattn::gemm(") or name == "longattn::convert":
        return None
    # The kernels' own, the layouts', the merges', and the context-parallel rings' sums of pieces.
    if name.startswith(("longattn::attention", "longattn::top_k_layout", "longattn::merge_partial", "longattn::dilated",
                        "longattn::ring_attention", "longattn::parallel::ring_attention",
                        "longattn::parallel::dilated_attention")) or "BlockSparseLayout" in name:
        return "attention"
    for prefix, cls in [("longattn::layer_norm_forward", "norm_forward"), ("longattn::layer_norm_backward", "norm_backward"),
                        ("longattn::gelu_forward", "gelu_forward"), ("longattn::gelu_backward", "gelu_backward"),
                        ("longattn::train::cross_entropy", "loss"), ("longattn::rotary_embedding", "rotary")]:
        if name.startswith(prefix):
            return cls
    return "rows"  # residual and bias adds, bias gradients, embeddings, fills, sequence parallelism's reorders


def timed_run(build, precision, steps, heads=ELEMENT_HEADS, context=512, batch=4, embed=128, options=(), ranks=1):
    """(seconds by class and "attention" on a rank, averaged over ranks; the trainer's JSON) of one
    run: cores // ranks copies of it at once, so that every core computes as in a training job
    (one rank alone, the other core idle, ran its element-wise kernels 1.2-1.5x faster on a 2-core
    virtual machine); the seconds are averaged over every copy's ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        tools = {"KOKKOS_PROFILE_LIBRARY": os.path.join(build, "perf_tests/liblongattn_kernel_times.so"),
                 "LONGATTN_KERNEL_TIMES": os.path.join(tmp, "times-%p.json")}
        trainer = run_copies(os.path.join(build, "apps/train/longattn-train"), ranks,
                             ["--steps", str(steps), "--precision", precision] + model(heads, context, batch, embed) +
                             list(options), "element_costs.py", threads=1,
                             copies=max(1, (os.cpu_count() or 1) // ranks), extra_env=tools)[0]
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
    return seconds, trainer


def per_step(build, precision, **run):
    """Seconds by class and "attention" in one step (the two runs' difference), and the trainer's JSON
    with "element_rate" the highest of the runs' element probes (elements per second).
    Each run is repeated REPEATS times, alternating, and each class takes its fastest: on a shared
    virtual machine a whole run slows by up to 40% for seconds at a time (a neighbour's cache and
    memory traffic; the FMA probe does not see it), which the fastest of three mostly escapes."""
    fastest, rate = {}, 0.0
    for _ in range(REPEATS):
        for steps in STEPS:
            seconds, trainer = timed_run(build, precision, steps, **run)
            rate = max(rate, trainer["element_rate"])
            fastest[steps] = {cls: min(t, fastest[steps][cls]) for cls, t in seconds.items()} if steps in fastest else seconds
    short, long = fastest[STEPS[0]], fastest[STEPS[1]]
    return {cls: max(0.0, long[cls] - short[cls]) / (STEPS[1] - STEPS[0]) for cls in long}, dict(trainer, element_rate=rate)


# The other kinds and the rings at head dimension 64 (E 128, 2 heads). Every pass of the dilated
# configuration runs on segments of DILATED_SEGMENT tokens (w / r).
DILATED = "dilated:w=128,256,512;r=1,2,4"
DILATED_SEGMENT = 128
KINDS = {"dilated": {"options": ["--attention", DILATED]},
         "block_sparse": {"options": ["--attention", "block_sparse:pattern=local_window;radius=128"]},
         "ring": {"options": ["--cp", "2"], "ranks": 2},
         "dilated_ring": {"options": ["--attention", DILATED, "--cp", "2"], "ranks": 2}}


def measure_trainer_kernels(build, core_peak_gflops):
    """The element costs {"fp32": {class: cost}, "bf16": ..., "fp16": ...}, the element probe's rate in
    the runs that timed them {"fp32": elements per second, ...}, dense attention by head
    dimension {"fp32": [[head dim, efficiency], ...], ...} and by length against 512 tokens
    {"fp32": [[tokens, factor], ...], ...}, and the kinds' and the rings' factors {"fp32":
    {"dilated": f, "block_sparse": f, "ring": f, "dilated_ring": f}, ...}: dilated attention against
    dense attention over segments of its passes' length, block-sparse attention and the dense
    ring against dense attention, the dilated ring (cp 2) against dilated attention on one rank."""
    peak = core_peak_gflops * 1e9

    def efficiency(seconds, trainer):
        return trainer["predicted_attention_flops"] / (seconds["attention"] * peak)

    costs, rates, by_head_dim, by_length, factors = {}, {}, {}, {}, {}
    for precision in ["fp32", "bf16", "fp16"]:
        by_head_dim[precision] = []
        for embed, heads in HEAD_DIMS:
            seconds, trainer = per_step(build, precision, heads=heads, embed=embed)
            by_head_dim[precision].append([embed // heads, round(efficiency(seconds, trainer), 4)])
            if (embed, heads) == (128, ELEMENT_HEADS):
                dense = efficiency(seconds, trainer)
                elements = trainer["predicted_elements"]
                costs[precision] = {cls: round(seconds[cls] / elements[cls] * peak, 3) if elements[cls] > 0 else 0.0
                                    for cls in CLASSES}
                rates[precision] = round(trainer["element_rate"])
        length = {tokens: efficiency(*per_step(build, precision, **length_run(tokens))) / dense
                  for tokens in LENGTHS}
        by_length[precision] = [[tokens, round(f, 4)] for tokens, f in length.items()]
        kind = {name: efficiency(*per_step(build, precision, **run)) for name, run in KINDS.items()}
        factors[precision] = {name: round(f, 4) for name, f in [
            ("dilated", kind["dilated"] / (dense * length[DILATED_SEGMENT])),
            ("block_sparse", kind["block_sparse"] / dense), ("ring", kind["ring"] / dense),
            ("dilated_ring", kind["dilated_ring"] / kind["dilated"])]}
    return costs, rates, by_head_dim, by_length, factors


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
    costs, rates, by_head_dim, by_length, factors = measure_trainer_kernels(build, peak)
    print(json.dumps({"element_costs": costs, "element_rates": rates, "attention_by_head_dim": by_head_dim, "attention_by_length": by_length,
                      "attention_factors": factors}, indent=2))


if __name__ == "__main__":
    main()
