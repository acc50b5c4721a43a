#!/usr/bin/env python3
"""longattn's block-sparse attention beside PyTorch's scaled_dot_product_attention given the
equivalent boolean mask, in one run.

For each case (B = 1, H = 8, D = 64, fp32, CPU, not causal; N = --tokens) it runs longattn's
benchmark program for that one case (BM_BlockSparseForward / BM_BlockSparseForwardBackward,
one step), then SDPA with the token mask of the same pattern, with the same number of threads,
and prints both times and the ratio, and longattn's time relative to its own dense attention
at the same N (BM_AttentionForward / BM_AttentionForwardBackward).

Masks for SDPA, from the patterns' definitions (block_sparse_patterns.hpp): local window,
dilated blocks and global + local exactly; top-k from the pooled scores of SDPA's own q and k;
random with the same number of key blocks per query block, drawn by torch (SDPA computes every
block whatever the mask holds, so which blocks are drawn does not change its time). Top-k has a
mask per head: SDPA then leaves its fused CPU kernel for the math path and its N x N x H
scores (24 GB at N = 16K), so it runs one head at a time, each with its own mask.

torch is a tool of this script only (perf_tests/with_torch.sh installs it in a private
virtual environment); nothing in the build or the tests uses it.

  compare_block_sparse.py --bench build/release/perf_tests/longattn_bench_attention
                          [--threads 2] [--tokens 16384] [--modes forward forward+backward]
                          [--patterns "random 10%" top_k ...] [--json out.json]
"""
import argparse
import json
import os
import sys

from timing import run_benchmark, seconds_per_step

BLOCK, HEADS, HEAD_DIM = 64, 8, 64
# (name, pattern id of the benchmark, density in percent for random)
CASES = [("random 5%", 0, 5), ("random 10%", 0, 10), ("random 25%", 0, 25), ("random 50%", 0, 50),
         ("random 100%", 0, 100), ("local_window", 1, 0), ("dilated", 2, 0), ("global_local", 3, 0),
         ("top_k", 4, 0)]


def run_bench(bench, name, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false")
    out = run_benchmark([bench, f"--benchmark_filter=^{name}", "--benchmark_format=json"], env)
    runs = json.loads(out)["benchmarks"]
    if not runs:
        sys.exit(f"{bench} ran no benchmark for {name}")
    return runs[0]


def longattn_seconds(bench, mode, tokens, pattern, percent, threads):
    name = {"forward": "BM_BlockSparseForward", "forward+backward": "BM_BlockSparseForwardBackward"}[mode]
    run = run_bench(bench, f"{name}/{tokens}/{pattern}/{percent}/", threads)
    return run["seconds_per_step"], run["density"]


def dense_seconds(bench, mode, tokens, threads):
    name = {"forward": "BM_AttentionForward", "forward+backward": "BM_AttentionForwardBackward"}[mode]
    run = run_bench(bench, f"{name}<float>/{tokens}/{HEAD_DIM}/0/", threads)
    return run["real_time"] / run["iterations"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[run["time_unit"]]


def block_mask(torch, pattern, percent, tokens, q, k):
    """[blocks, blocks] bool (or [H, blocks, blocks] for top-k) of the benchmark's pattern."""
    blocks = tokens // BLOCK
    qb = torch.arange(blocks).unsqueeze(1)
    kb = torch.arange(blocks).unsqueeze(0)
    gap = (kb - qb).abs() * BLOCK - (BLOCK - 1)  # token gap between the blocks' nearest tokens
    if pattern == 0:
        g = torch.Generator().manual_seed(2026)
        kept = max(1, min(blocks, round(percent / 100 * blocks)))
        order = torch.rand(blocks, blocks, generator=g).argsort(dim=1)[:, :kept]
        return torch.zeros(blocks, blocks, dtype=torch.bool).scatter_(1, order, True)
    if pattern == 1:
        return gap <= tokens // 20
    if pattern == 2:
        rates, r = [0], 1
        while r < blocks:
            rates.append(r)
            r *= 2
        return torch.isin((kb - qb).abs(), torch.tensor(rates))
    if pattern == 3:
        global_blocks = -(-(tokens // 64) // BLOCK)
        return (qb < global_blocks) | (kb < global_blocks) | (gap <= tokens // 32)
    # top-k: the diagonal and the k - 1 best pooled scores of the rest, per head
    top_k = max(1, blocks // 10)
    pooled_q = q[0].reshape(HEADS, blocks, BLOCK, HEAD_DIM).mean(2)
    pooled_k = k[0].reshape(HEADS, blocks, BLOCK, HEAD_DIM).mean(2)
    scores = pooled_q @ pooled_k.transpose(1, 2)
    scores.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    chosen = scores.topk(top_k, dim=2).indices
    return torch.zeros(HEADS, blocks, blocks, dtype=torch.bool).scatter_(2, chosen, True)


def sdpa_seconds(torch, mode, tokens, pattern, percent):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(2026)
    q, k, v, d_o = (torch.rand(1, HEADS, tokens, HEAD_DIM, generator=g) * 2 - 1 for _ in range(4))
    blocks = block_mask(torch, pattern, percent, tokens, q, k)
    density = blocks.float().mean().item()
    # One (q, k, v, dO, mask) per SDPA call: all heads, or one head each for per-head masks.
    per_head = blocks.dim() == 3
    heads = [slice(h, h + 1) for h in range(HEADS)] if per_head else [slice(0, HEADS)]
    calls = [(q[:, s].contiguous(), k[:, s].contiguous(), v[:, s].contiguous(), d_o[:, s].contiguous(),
              (blocks[s.start] if per_head else blocks).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1))
             for s in heads]
    if mode == "forward":
        def step():
            with torch.no_grad():
                for q_, k_, v_, _, mask in calls:
                    F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask)
    else:
        for q_, k_, v_, _, _ in calls:
            q_.requires_grad_(), k_.requires_grad_(), v_.requires_grad_()

        def step():
            for q_, k_, v_, d_o_, mask in calls:
                F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask).backward(d_o_)
    return seconds_per_step(step, min_time=0), density


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="path of longattn_bench_attention")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tokens", type=int, default=16384, help="16384 or 65536 (the benchmark's sizes)")
    parser.add_argument("--modes", nargs="+", default=["forward", "forward+backward"])
    parser.add_argument("--patterns", nargs="+", default=[c[0] for c in CASES], help="a subset of the cases")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; longattn {args.bench}, "
          f"OMP_NUM_THREADS={args.threads}; N = {args.tokens}, B = 1, H = {HEADS}, D = {HEAD_DIM}, fp32")
    rows = []
    for mode in args.modes:
        dense = dense_seconds(args.bench, mode, args.tokens, args.threads)
        print(f"\n{mode}: longattn dense {dense:.3f} s")
        print(f"{'pattern':<14} {'density':>8} {'longattn s':>11} {'x dense':>8} {'SDPA+mask s':>12} "
              f"{'SDPA density':>13} {'SDPA / longattn':>16}")
        for name, pattern, percent in (c for c in CASES if c[0] in args.patterns):
            ours, density = longattn_seconds(args.bench, mode, args.tokens, pattern, percent, args.threads)
            theirs, their_density = sdpa_seconds(torch, mode, args.tokens, pattern, percent)
            rows.append(dict(mode=mode, pattern=name, density=density, longattn_s=ours, dense_s=dense,
                             relative_to_dense=ours / dense, sdpa_s=theirs, sdpa_density=their_density,
                             speedup_over_sdpa=theirs / ours))
            print(f"{name:<14} {density:>8.3f} {ours:>11.3f} {ours / dense:>8.3f} {theirs:>12.3f} "
                  f"{their_density:>13.3f} {theirs / ours:>16.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=args.threads, tokens=args.tokens, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
