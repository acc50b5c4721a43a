#!/usr/bin/env python3
"""longattn's Python package beside dilated-attention-pytorch, in one run.

1. The drop-in: longattn.torch.DilatedAttention against the seed library's DilatedAttention, the
   same module arguments (segment_lengths 2048,4096,8192, dilation_rates 1,2,4), tensors
   (B = 1, H = 8, D = 64, fp32, CPU, not causal) and threads, through PyTorch: forward (no_grad)
   and forward+backward (autograd to q, k, v). Seconds per step, best of --repeat alternations.
2. The binding's overhead: longattn.attention_forward on numpy arrays against the C++ benchmark
   BM_DilatedForward of the same shape and spec (head_groups, not causal), alternating; the
   overhead is Python over C++ less 1. Two processes differ by more than the overhead on a
   shared machine, so it is also measured in one: the Python call (outputs allocated, the
   hand-over to the kernel thread and back) against the same call repeated in a C++ loop on
   the kernel thread (longattn._core.forward_seconds), alternating; and the fixed cost of a
   whole call on a 1-token, 1-head problem, an upper bound of what the binding adds to any call
   beyond its outputs' allocation; its share of the C++ time is the bound printed.

The seed library is never committed: pass a checkout of DarcStar-Solutions-Tech/dilated-
attention-pytorch with --seed. Run through perf_tests/with_torch.sh, which provides torch,
einops, torchscale and this package (pip install of the clone):

  perf_tests/with_torch.sh build/test compare_python.py --seed /path/to/dilated-attention-pytorch
                           [--threads 2] [--tokens 8192 16384 32768] [--repeat 2] [--json out.json]
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np

from compare_dilated import longattn_seconds, seed_seconds
from timing import seconds_per_step

SEGMENTS, RATES = [2048, 4096, 8192], [1, 2, 4]


def binding_seconds(longattn, tokens):
    rng = np.random.default_rng(2026)
    q, k, v = ((rng.random((1, tokens, 8, 64)) * 2 - 1).astype(np.float32) for _ in range(3))
    spec = longattn.dilated(SEGMENTS, RATES, mode="head_groups")
    return seconds_per_step(lambda: longattn.attention_forward(q, k, v, attention=spec))


def in_process_seconds(longattn, tokens, repeat):
    """(Python call, the same call in a C++ loop), seconds each, best of `repeat` alternations."""
    rng = np.random.default_rng(2026)
    q, k, v = ((rng.random((1, tokens, 8, 64)) * 2 - 1).astype(np.float32) for _ in range(3))
    spec = longattn.dilated(SEGMENTS, RATES, mode="head_groups")
    o, lse = longattn.attention_forward(q, k, v, attention=spec)
    calls = max(1, round(0.5 / seconds_per_step(lambda: longattn.attention_forward(q, k, v, attention=spec))))
    python = native = float("inf")
    for _ in range(repeat):
        python = min(python, seconds_per_step(lambda: longattn.attention_forward(q, k, v, attention=spec)))
        native = min(native, longattn._core.forward_seconds(q, k, v, o, lse, spec, False, calls))
    return python, native


def call_seconds(longattn):
    """A whole call on a [1, 1, 1, 8] problem: the binding's fixed cost plus a trivial kernel."""
    x = np.ones((1, 1, 1, 8), np.float32)
    return seconds_per_step(lambda: longattn.attention_forward(x, x, x))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="path of longattn_bench_attention")
    parser.add_argument("--seed", required=True, help="a checkout of dilated-attention-pytorch")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--overhead-tokens", type=int, nargs="+", default=[8192])
    parser.add_argument("--repeat", type=int, default=3, help="alternations per case; best of each side")
    parser.add_argument("--json", help="also write the tables here")
    args = parser.parse_args()

    import torch
    import longattn
    import longattn.torch
    sys.path.insert(0, os.path.abspath(args.seed))
    warnings.filterwarnings("ignore")  # the seed warns about optional packages (DeepSpeed, ...)
    from dilated_attention_pytorch.dilated_attention import DilatedAttention as SeedDilatedAttention
    torch.set_num_threads(args.threads)
    longattn.initialize(threads=args.threads)
    seed = SeedDilatedAttention(segment_lengths=SEGMENTS, dilation_rates=RATES)
    ours = longattn.torch.DilatedAttention(segment_lengths=SEGMENTS, dilation_rates=RATES)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; longattn on {longattn.execution_space()} "
          f"({longattn._core.concurrency()} threads); seed {args.seed}")

    # The drop-in computes what the seed module computes (float32: within rounding).
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.rand(1, args.tokens[0], 8, 64, generator=g) * 2 - 1 for _ in range(3))
    difference = (ours(q, k, v) - seed(q, k, v)).abs().max().item()
    print(f"largest |longattn - seed| at N {args.tokens[0]}: {difference:.2e}")
    if difference > 1e-4:
        sys.exit("the drop-in's output differs from the seed module's")

    print(f"\n{'mode':<17} {'N':>7} {'longattn s':>11} {'seed s':>9} {'seed / longattn':>16}")
    drop_in = []
    for mode in ["forward", "forward+backward"]:
        for tokens in args.tokens:
            mine = theirs = float("inf")
            for _ in range(args.repeat):
                mine = min(mine, seed_seconds(torch, ours, mode, tokens))  # any module's step
                theirs = min(theirs, seed_seconds(torch, seed, mode, tokens))
            drop_in.append(dict(mode=mode, tokens=tokens, longattn_seconds=mine, seed_seconds=theirs,
                                speedup=theirs / mine))
            print(f"{mode:<17} {tokens:>7} {mine:>11.4f} {theirs:>9.4f} {theirs / mine:>16.2f}", flush=True)

    fixed = min(call_seconds(longattn) for _ in range(args.repeat))
    print(f"\nfixed cost of a call (1 token, 1 head): {fixed * 1e6:.1f} us")
    print(f"{'binding, forward':<17} {'N':>7} {'python s':>11} {'C++ s':>9} {'ratio - 1':>16} {'fixed / C++':>12}")
    overhead = []
    for tokens in args.overhead_tokens:
        python = native = float("inf")
        for _ in range(args.repeat):
            python = min(python, binding_seconds(longattn, tokens))
            native = min(native, longattn_seconds(args.bench, "forward", tokens, args.threads))  # head_groups
        same_python, same_native = in_process_seconds(longattn, tokens, args.repeat)
        overhead.append(dict(tokens=tokens, python_seconds=python, cpp_seconds=native,
                             overhead=python / native - 1, fixed_call_seconds=fixed, fixed_share=fixed / native,
                             in_process_python_seconds=same_python, in_process_cpp_seconds=same_native,
                             in_process_overhead=same_python / same_native - 1))
        print(f"{'':<17} {tokens:>7} {python:>11.4f} {native:>9.4f} {100 * (python / native - 1):>15.1f}% "
              f"{100 * fixed / native:>11.3f}%", flush=True)
        print(f"{'  one process':<17} {tokens:>7} {same_python:>11.4f} {same_native:>9.4f} "
              f"{100 * (same_python / same_native - 1):>15.1f}%", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=args.threads, largest_difference=difference,
                           drop_in=drop_in, overhead=overhead), f,
                      indent=1)


if __name__ == "__main__":
    main()
