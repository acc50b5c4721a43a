#!/usr/bin/env python3
"""Writes the kernel efficiencies longattn-plan reads with --calibration: the fraction of the
machine's measured peak that the matmul (sgemm through Kokkos Kernels) and the fused attention
kernels (dense, dilated, block-sparse; forward + backward) reach on this machine, and a table of
matrix-product efficiencies by shape (m in 128-16384 rows, n and k in 64-1024; float, bfloat16
as this machine runs it and float16, each with its operand copies as the gemm call makes them:
longattn_bench_ceilings' BM_GemmGrid), from which the
planner takes each of a model's products at the measured shape nearest to its own. The table is
measured on one core (a copy on each core at once, so that every core computes as in a training
job; the fastest of three repetitions of a shape), as a fraction of one core's peak: what each
of longattn-train's ranks of one thread reaches (with several threads per process, Kokkos' spinning OpenMP threads and
OpenBLAS' own share the cores, and the small 16-bit products measured 10-50x slower).

    perf_tests/write_calibration.py BUILD_DIR OUT.json

It also times longattn-train's own kernels on one rank of one thread, in each precision, under
the kernel_times Kokkos Tools library (perf_tests/element_costs.py): the cost per element of
those that are neither matrix products nor attention (LayerNorm, GELU, the row kernels, the
loss, the optimizer: plan::ElementClass), dense attention's efficiency
at head dimensions 8-256 and its factor at 64-2048 tokens, and the factors of dilated and
block-sparse attention and of context-parallel rings.

BUILD_DIR is a build with apps and benchmarks (build/test). The peak and sgemm come from
longattn-info --json, the attention rates from longattn_bench_attention in the same run. Run it
on the machine you plan for (on a GPU build, the GPU's kernels); the planner applies these
fractions to the GPU table's peak. The element costs are the host's: kernel_times sees a GPU
kernel's launch only.
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

from element_costs import measure_trainer_kernels

# One representative shape per kind (B = 1, H = 8, fp32): forward + backward.
BENCHMARKS = {
    "dense": "BM_AttentionForwardBackward<float>/8192/128/1",  # N = 8192, D = 128, causal
    "dilated": "BM_DilatedForwardBackward/65536/1/0",        # N = 64K, causal, longnet
    "block_sparse": "BM_BlockSparseForwardBackward/65536/0/10",  # N = 64K, density 10%
}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build, out_path = sys.argv[1], sys.argv[2]
    # Kokkos' advice for benchmarks (and no warning on stdout, which carries the JSON).
    env = dict(os.environ)
    env.setdefault("OMP_PROC_BIND", "spread")
    env.setdefault("OMP_PLACES", "threads")
    with tempfile.TemporaryDirectory() as tmp:
        info_json = os.path.join(tmp, "info.json")
        subprocess.run([os.path.join(build, "apps/info/longattn-info"), "--json", info_json], check=True,
                       stdout=subprocess.DEVNULL, env=env)
        with open(info_json) as f:
            ceilings = json.load(f)["ceilings"]
    peak = ceilings["fp32_fma_peak_all_cores"]["gflops"]
    efficiency = {"matmul": ceilings["sgemm_all_cores"]["gflops"] / peak, "attention": {}}
    bench = os.path.join(build, "perf_tests/longattn_bench_attention")
    for kind, name in BENCHMARKS.items():
        run = subprocess.run([bench, "--benchmark_filter=^" + name + "/", "--benchmark_format=json"], check=True,
                             capture_output=True, text=True, env=env)
        results = [b for b in json.loads(run.stdout)["benchmarks"] if b["name"].startswith(name)]
        if not results:
            sys.exit(f"write_calibration.py: benchmark {name} did not run")
        efficiency["attention"][kind] = results[0]["FLOP/s"] / 1e9 / peak
    for name, value in [("matmul", efficiency["matmul"])] + list(efficiency["attention"].items()):
        if not 0 < value <= 1:
            sys.exit(f"write_calibration.py: {name} reached {value:.3f} of the measured peak ({peak:.1f} GFLOP/s); "
                     "the peak probe underestimates this machine, re-run on a quiet machine")
    ceilings_bench = os.path.join(build, "perf_tests/longattn_bench_ceilings")
    # One copy of the grid on every core at once (each core computing, as in a training job), three
    # repetitions of each shape, the fastest of each copy taken (a shared machine slows whole
    # seconds), then the copies' mean.
    command = [ceilings_bench, "--benchmark_filter=^BM_GemmGrid/", "--benchmark_format=json",
               "--benchmark_min_time=0.2", "--benchmark_repetitions=3"]
    # Unbound: the benchmarks' OMP_PROC_BIND=spread would put every copy's one thread on the first core.
    copies = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                               env=dict(env, OMP_NUM_THREADS="1", OMP_PROC_BIND="false"))
              for _ in range(ceilings["cores"])]
    grids = [json.loads(copy.communicate()[0]) for copy in copies]
    if any(copy.returncode != 0 for copy in copies):
        sys.exit(f"write_calibration.py: {' '.join(command)} failed")
    fastest = {}  # shape -> [the fastest FLOP/s of each copy]
    for grid in grids:
        best = {}
        for b in grid["benchmarks"]:
            if b.get("run_type", "iteration") == "iteration":
                best[b["run_name"]] = max(best.get(b["run_name"], 0.0), b["FLOP/s"])
        for name, flops in best.items():
            fastest.setdefault(name, []).append(flops)
    grid = grids[0]
    # A virtual machine's clock drifts by 10-20% between probes: the higher of longattn-info's
    # one-core peak and the one the grid's program measured just before its products.
    core_peak = max(ceilings["fp32_fma_peak_one_core"]["gflops"], float(grid["context"]["fp32_fma_peak_one_core_gflops"]))
    shapes = {"fp32": [], "16bit": [], "fp16": []}
    for name, flops in fastest.items():
        m, n, k, precision = (int(x) for x in name.split("/")[1:5])
        fraction = sum(flops) / len(flops) / 1e9 / core_peak
        if not 0 < fraction <= (2 if precision else 1):  # AVX512-BF16: two products a lane, up to 2x
            sys.exit(f"write_calibration.py: {name} reached {fraction:.3f} of the measured peak; re-run on a quiet machine")
        shapes[["fp32", "16bit", "fp16"][precision]].append([m, n, k, round(fraction, 4)])
    efficiency["matmul_shapes"] = shapes
    (efficiency["element_costs"], efficiency["element_rates"], efficiency["attention_by_head_dim"],
     efficiency["attention_by_length"], efficiency["attention_factors"]) = measure_trainer_kernels(build, core_peak)
    efficiency["fp32_fma_peak_gflops"] = peak  # what the fractions divide by (plan_check.py reads it)
    efficiency["fp32_fma_peak_one_core_gflops"] = core_peak
    efficiency["cores"] = ceilings["cores"]
    efficiency["source"] = (f"measured {datetime.date.today()}, {ceilings['cores']} cores, "
                            f"FP32 FMA peak {peak:.1f} GFLOP/s; " + ", ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()))
    with open(out_path, "w") as f:
        json.dump(efficiency, f, indent=2)
        f.write("\n")
    print(json.dumps(efficiency, indent=2))


if __name__ == "__main__":
    main()
