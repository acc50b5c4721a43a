#!/usr/bin/env python3
"""longattn's dilated attention beside dilated-attention-pytorch's DilatedAttention, in one run.

Same configuration on both sides: B = 1, H = 8, D = 64, fp32, CPU, w = 2048,4096,8192,
r = 1,2,4, non-causal, the seed library's semantics (longattn's head_groups mode: heads split
into groups, group i uses (w_i, r_i) with offset i mod r_i, output divided by the number of
groups), the same number of threads. For each N it runs longattn's benchmark program for that
one case, then the seed's module, alternating `--repeat` times and keeping each side's best
time (the development machines are shared VMs whose speed drifts by 10-20% within a minute).
Prints seconds per step and the ratio seed / longattn (above 1: longattn is faster).

The seed library is not part of longattn and is never committed: pass a checkout of
DarcStar-Solutions-Tech/dilated-attention-pytorch with --seed. Run through
perf_tests/with_torch.sh, which provides torch, einops and torchscale:

  perf_tests/with_torch.sh build/release compare_dilated.py --seed /path/to/dilated-attention-pytorch
                           [--threads 2] [--tokens 8192 32768] [--repeat 2] [--json out.json]
"""
import argparse
import json
import os
import sys
import warnings

from timing import run_benchmark, seconds_per_step


def longattn_seconds(bench, mode, tokens, threads):
    name = {"forward": "BM_DilatedForward", "forward+backward": "BM_DilatedForwardBackward"}[mode]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false")
    case = f"{name}/{tokens}/1/0/"  # head_groups, non-causal
    out = run_benchmark([bench, f"--benchmark_filter=^{case}", "--benchmark_format=json",
                         "--benchmark_min_time=0.5"], env)
    runs = json.loads(out)["benchmarks"]
    if not runs:
        sys.exit(f"{bench} ran no benchmark {case}")
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[runs[0]["time_unit"]]
    return runs[0]["real_time"] * scale


def seed_seconds(torch, attention, mode, tokens, min_time=0.5):
    g = torch.Generator().manual_seed(2026)
    q, k, v, d_o = (torch.rand(1, tokens, 8, 64, generator=g) * 2 - 1 for _ in range(4))
    if mode == "forward":
        def step():
            with torch.no_grad():
                attention(q, k, v)
    else:
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()

        def step():
            attention(q, k, v).backward(d_o)
    return seconds_per_step(step, min_time)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="path of longattn_bench_attention")
    parser.add_argument("--seed", required=True, help="a checkout of dilated-attention-pytorch")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--modes", nargs="+", default=["forward", "forward+backward"])
    parser.add_argument("--repeat", type=int, default=2, help="alternations per case; best of each side")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()

    import torch
    sys.path.insert(0, os.path.abspath(args.seed))
    warnings.filterwarnings("ignore")  # the seed warns about optional packages (DeepSpeed, ...)
    from dilated_attention_pytorch.dilated_attention import DilatedAttention
    torch.set_num_threads(args.threads)
    attention = DilatedAttention(segment_lengths=[2048, 4096, 8192], dilation_rates=[1, 2, 4])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; seed {args.seed}; longattn {args.bench}")
    print(f"{'mode':<17} {'N':>7} {'longattn s':>11} {'seed s':>9} {'seed / longattn':>16}")
    rows = []
    for mode in args.modes:
        for tokens in args.tokens:
            ours = theirs = float("inf")
            for _ in range(args.repeat):
                ours = min(ours, longattn_seconds(args.bench, mode, tokens, args.threads))
                theirs = min(theirs, seed_seconds(torch, attention, mode, tokens))
            rows.append(dict(mode=mode, tokens=tokens, longattn_seconds=ours, seed_seconds=theirs,
                             speedup=theirs / ours))
            print(f"{mode:<17} {tokens:>7} {ours:>11.3f} {theirs:>9.3f} {theirs / ours:>16.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=args.threads, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
