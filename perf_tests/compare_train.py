#!/usr/bin/env python3
"""longattn-train's step beside the same model in PyTorch, on the same cores, in one run.

The PyTorch model is longattn-train's, layer for layer (torch_model.py: byte embedding + learned
positions, pre-norm blocks with scaled_dot_product_attention (causal) and MAGNETO's sub-LayerNorm,
GELU (tanh) MLP, final LayerNorm, LM head, cross-entropy), random weights, torch.optim.AdamW. One process with all the
threads (PyTorch's usual data-parallel on one CPU node); longattn-train runs under
mpiexec with the given ranks (data parallel, cores / ranks threads each) and with 1 rank.
Both run `--steps` steps of the same global batch; each side's time is the median step after
the first. Sides alternate `--repeat` times; the best of each is kept (shared VMs drift).

torch is a tool of this script only (perf_tests/with_torch.sh installs it in a private
virtual environment); nothing in the build or the tests uses it.

  with_torch.sh build/release compare_train.py [--ranks 2] [--steps 8] [--repeat 2]
"""
import argparse
import os
import statistics
import sys
import time

import torch_model
from train_runs import run_training


def longattn_step_seconds(program, ranks, threads, args):
    summary = run_training(program, ranks, args, "compare_train.py", threads)
    return statistics.median(s["seconds"] for s in summary["steps"][1:]), summary["flops_per_step"]


def torch_step_seconds(torch, threads, layers, embed, heads, context, batch, steps):
    torch.set_num_threads(threads)
    parameters = torch_model.random_parameters(torch, layers, embed, context)
    for p in parameters.values():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(parameters.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, 256, (batch, context + 1))
    weights = torch.ones(batch, context)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = torch_model.loss(torch, parameters, ids[:, :-1], ids[:, 1:], weights, layers, heads, "learned",
                                torch.float32)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters.values(), 1.0)
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="a benchmark in the build (with_torch.sh passes it)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    a = parser.parse_args()
    import torch

    program = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.bench))), "apps", "train", "longattn-train")
    if not os.access(program, os.X_OK):
        sys.exit(f"no {program}: build longattn-train")
    args = ["--layers", str(a.layers), "--embed", str(a.embed), "--heads", str(a.heads), "--context",
            str(a.context), "--batch", str(a.batch), "--steps", str(a.steps)]
    best = {}
    for _ in range(a.repeat):
        for name, run in (
                (f"longattn-train, {a.ranks} ranks x {max(1, a.threads // a.ranks)} threads",
                 lambda: longattn_step_seconds(program, a.ranks, max(1, a.threads // a.ranks), args)[0]),
                (f"longattn-train, 1 rank x {a.threads} threads",
                 lambda: longattn_step_seconds(program, 1, a.threads, args)[0]),
                (f"PyTorch {torch.__version__}, 1 process x {a.threads} threads",
                 lambda: torch_step_seconds(torch, a.threads, a.layers, a.embed, a.heads, a.context, a.batch, a.steps))):
            seconds = run()
            best[name] = min(best.get(name, seconds), seconds)
    flops = longattn_step_seconds(program, 1, a.threads, args[:-1] + ["2"])[1]
    tokens = a.batch * a.context
    reference = best[next(name for name in best if name.startswith("PyTorch"))]
    print(f"{a.layers} layers, embed {a.embed}, {a.heads} heads, context {a.context}, batch {a.batch} "
          f"({tokens} tokens, {flops / 1e9:.1f} GFLOP per step); median step, best of {a.repeat}")
    for name, seconds in best.items():
        print(f"  {name:45s} {seconds:7.3f} s/step  {tokens / seconds:8.0f} tok/s  "
              f"{flops / seconds / 1e9:6.1f} GFLOP/s  PyTorch time / this {reference / seconds:5.2f}")


if __name__ == "__main__":
    main()
