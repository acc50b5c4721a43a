#!/usr/bin/env python3
"""longattn's fused attention beside PyTorch's scaled_dot_product_attention, in one run.

For each shape (B = 1, H = 8 or --heads; fp32, and with --dtypes bf16 too) it runs longattn's benchmark program
(perf_tests/longattn_bench_attention) for that one shape, then SDPA on the same shape with the
same number of threads, alternating, `--repeat` times, and keeps each side's best time: the
development machines are shared VMs whose speed drifts by 10-20% within a minute, so
alternating and taking the best compares like with like. Prints GFLOP/s (counted as in the
benchmark: forward 4 B H N^2 D, forward + backward 3.5x that, halved when causal) and the ratio.
In bf16 both sides take bfloat16 tensors (longattn: bfloat16 storage, float accumulation; SDPA:
torch.bfloat16 tensors, whatever its CPU kernel does with them).

With --device cuda (a CUDA build of longattn) both sides run on the GPU: longattn's benchmarks
named <T, Kokkos::Cuda>, SDPA on CUDA tensors (whichever of its kernels PyTorch picks: flash or
memory-efficient attention), each step ended by a synchronization.

torch is a tool of this script only (perf_tests/with_torch.sh installs it in a private
virtual environment); nothing in the build or the tests uses it.

  compare_sdpa.py --bench build/release/perf_tests/longattn_bench_attention [--threads 2]
                  [--tokens 1024 4096] [--head-dims 64 128] [--dtypes fp32 bf16] [--repeat 2]
                  [--device cpu|cuda] [--heads 16] [--json out.json]
"""
import argparse
import json
import os
import sys

from timing import run_benchmark, seconds_per_step


BENCH_TYPES = {"fp32": "float", "bf16": "longattn::bfloat16"}


def longattn_gflops(bench, mode, dtype, tokens, head_dim, causal, threads, device, heads, program):
    name = {"forward": "BM_AttentionForward", "forward+backward": "BM_AttentionForwardBackward"}[mode]
    # <T[, Kokkos::Cuda][, H][, program]>: the benchmark names a head count other than 8, and a
    # tensor-core program other than automatic (after the head count).
    types = BENCH_TYPES[dtype] + (", Kokkos::Cuda" if device == "cuda" else "")
    if program != "automatic":
        types += f", {heads}, longattn::TensorCoreProgram::{program}"
    elif heads != 8:
        types += f", {heads}"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false")
    out = run_benchmark(
        [bench, f"--benchmark_filter=^{name}<{types}>/{tokens}/{head_dim}/{int(causal)}/",
         "--benchmark_format=json", "--benchmark_min_time=0.5"], env)
    runs = json.loads(out)["benchmarks"]
    if not runs:
        sys.exit(f"{bench} ran no benchmark for {name}<{types}>/{tokens}/{head_dim}/{int(causal)}")
    return runs[0]["FLOP/s"] * 1e-9


def sdpa_gflops(torch, mode, dtype, tokens, head_dim, causal, device, heads, min_time=0.5):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(2026)
    torch_type = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    q, k, v, d_o = ((torch.rand(1, heads, tokens, head_dim, generator=g) * 2 - 1).to(device, torch_type)
                    for _ in range(4))
    flops = 4.0 * heads * tokens * tokens * head_dim / (2 if causal else 1)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if mode == "forward":
        def step():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            synchronize()
    else:
        flops *= 3.5
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()

        def step():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(d_o)
            synchronize()
    return flops / seconds_per_step(step, min_time) * 1e-9


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="path of longattn_bench_attention")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--modes", nargs="+", default=["forward", "forward+backward"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32"], choices=sorted(BENCH_TYPES))
    parser.add_argument("--repeat", type=int, default=2, help="alternations per shape; best of each side")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--heads", type=int, default=8, help="H of B = 1, H heads (the benchmark has 8, and 16 for bf16 on CUDA)")
    parser.add_argument("--program", default="automatic", choices=["automatic", "warp", "warpgroup"],
                        help="AttentionOptions::tensor_core_forward and tensor_core_backward (CUDA, bf16, 16 heads: "
                             "the benchmarks registered)")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}; longattn {args.bench}, OMP_NUM_THREADS={args.threads}")
    print(f"{'mode':<17} {'type':>5} {'N':>6} {'D':>4} {'causal':>6} {'longattn GFLOP/s':>17} {'SDPA GFLOP/s':>13} "
          f"{'ratio':>6}")
    rows = []
    for mode, dtype in ((m, t) for t in args.dtypes for m in args.modes):
        for head_dim in args.head_dims:
            for causal in (False, True):
                for tokens in args.tokens:
                    ours = theirs = 0.0
                    for _ in range(args.repeat):
                        ours = max(ours, longattn_gflops(args.bench, mode, dtype, tokens, head_dim, causal,
                                                         args.threads, args.device, args.heads,
                                                         args.program))
                        theirs = max(theirs, sdpa_gflops(torch, mode, dtype, tokens, head_dim, causal,
                                                         args.device, args.heads))
                    rows.append(dict(mode=mode, dtype=dtype, tokens=tokens, head_dim=head_dim, causal=causal,
                                     heads=args.heads, program=args.program,
                                     longattn_gflops=ours, sdpa_gflops=theirs,
                                     ratio=ours / theirs))
                    print(f"{mode:<17} {dtype:>5} {tokens:>6} {head_dim:>4} {str(causal):>6} {ours:>17.1f} "
                          f"{theirs:>13.1f} {ours / theirs:>6.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, device=args.device, threads=args.threads, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
