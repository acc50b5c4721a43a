#!/usr/bin/env python3
"""longattn-train's run trained again by the same model in PyTorch: the same initial weights, the
same batches, the same AdamW; the losses of the first steps side by side, and each side's tokens/s.

longattn-train runs on one rank with --export-reference (apps/train/include/longattn/train/
reference_export.hpp: its initial weights and each step's global batch); this script builds the
model in PyTorch layer for layer (torch_model.py), loads those weights by group name, and trains
on those batches with longattn's AdamW formula in the same precision: fp32, or bf16 with fp32
master weights (parameters cast to bf16 for each step, as longattn-train's --precision bf16 keeps
them). In fp32 the two differ by float rounding only; in bf16 by bf16 rounding of different
operation orders. Tokens/s: each side's median step after the first, in the same call (on a GPU:
longattn's CUDA build beside PyTorch eager with SDPA).

torch is a tool of this script only (perf_tests/with_torch.sh installs it in a private virtual
environment); nothing in the build or the tests uses it.

  with_torch.sh build/release reference_train.py [--precision fp32|bf16] [--positions learned|rotary]
      [--steps 6] [--layers 2 --embed 128 --heads 4 --context 256 --batch 4] [--device cpu|cuda] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch_model
from train_runs import run_training

OPTIMIZER = {"lr": 2e-3, "min_lr": 2e-4, "warmup": 2, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1, "clip": 1.0}


def read_export(torch, directory, embed, context, device):
    """The exported initial weights (name -> fp32 tensor), decayed names, and the per-step batches."""
    import numpy as np
    with open(os.path.join(directory, "reference.json")) as f:
        index = json.load(f)
    values = np.fromfile(os.path.join(directory, "weights.bin"), dtype=np.float32)
    master, decay = {}, set()
    for g in index["groups"]:
        piece = values[g["offset"]:g["offset"] + g["count"]]
        master[g["name"]] = torch.tensor(piece, device=device).reshape(torch_model.shape(g["name"], embed, context))
        if g["decay"]:
            decay.add(g["name"])
    # Per step: inputs int32 [B, N], targets int32 [B, N], loss weights float32 [B, N].
    B, N = index["sequences"], index["tokens"]
    words = np.fromfile(os.path.join(directory, "batches.bin"), dtype=np.int32).reshape(-1, 3, B, N)
    batches = [(torch.tensor(step[0], dtype=torch.int64, device=device),
                torch.tensor(step[1], dtype=torch.int64, device=device),
                torch.tensor(step[2].view(np.float32), device=device)) for step in words]
    return master, decay, batches


def torch_training(torch, master, decay, batches, a):
    """Losses and step seconds of PyTorch training on the exported batches."""
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    for w in master.values():
        w.requires_grad_(True)
    optimizer = torch_model.AdamW(torch, master, decay, OPTIMIZER["beta1"], OPTIMIZER["beta2"], 1e-8,
                                  OPTIMIZER["weight_decay"], OPTIMIZER["clip"])
    losses, seconds = [], []
    for step, (ids, targets, weights) in enumerate(batches):
        if a.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = torch_model.loss(torch, master, ids, targets, weights, a.layers, a.heads, a.positions, dtype)
        gradients = dict(zip(master, torch.autograd.grad(loss, list(master.values()))))
        lr = torch_model.learning_rate(OPTIMIZER["lr"], OPTIMIZER["min_lr"], OPTIMIZER["warmup"], step, len(batches))
        optimizer.step(gradients, lr)
        losses.append(float(loss.detach()))
        if a.device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return losses, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="a benchmark in the build (with_torch.sh passes it)")
    parser.add_argument("--program", help="longattn-train (default: the build's, beside --bench)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--positions", choices=["learned", "rotary"], default="learned")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embed", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tolerance", type=float, help="largest relative loss difference allowed "
                        "(default 1e-4 in fp32; in bf16 4e-3, its unit roundoff); exit 1 beyond it")
    parser.add_argument("--json", help="write the losses and rates here")
    a = parser.parse_args()
    import torch
    torch.set_num_threads(a.threads)

    program = a.program or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.bench))), "apps", "train",
                                        "longattn-train")
    if not os.access(program, os.X_OK):
        sys.exit(f"no {program}: build longattn-train")
    with tempfile.TemporaryDirectory() as export:
        args = ["--layers", a.layers, "--embed", a.embed, "--heads", a.heads, "--context", a.context,
                "--batch", a.batch, "--steps", a.steps, "--precision", a.precision, "--positions", a.positions,
                "--lr", OPTIMIZER["lr"], "--min-lr", OPTIMIZER["min_lr"], "--warmup", OPTIMIZER["warmup"],
                "--beta1", OPTIMIZER["beta1"], "--beta2", OPTIMIZER["beta2"],
                "--weight-decay", OPTIMIZER["weight_decay"], "--clip", OPTIMIZER["clip"],
                "--export-reference", export]
        summary = run_training(program, 1, [str(x) for x in args], "reference_train.py", a.threads)
        master, decay, batches = read_export(torch, export, a.embed, a.context, a.device)
    theirs, torch_seconds = torch_training(torch, master, decay, batches, a)
    ours = [s["loss"] for s in summary["steps"]]
    ours_seconds = [s["seconds"] for s in summary["steps"]]
    tokens = a.batch * a.context
    differences = [abs(x - y) / abs(y) for x, y in zip(ours, theirs)]
    tolerance = a.tolerance or (1e-4 if a.precision == "fp32" else 2.0 ** -8)
    rates = {"longattn": tokens / statistics.median(ours_seconds[1:]),
             "pytorch": tokens / statistics.median(torch_seconds[1:])}
    print(f"{a.layers} layers, embed {a.embed}, {a.heads} heads, context {a.context}, batch {a.batch}, "
          f"{a.precision}, {a.positions} positions, {a.device}; PyTorch {torch.__version__}")
    print("step  longattn loss  PyTorch loss  relative difference")
    for s, (x, y, d) in enumerate(zip(ours, theirs, differences)):
        print(f"{s + 1:4d}  {x:13.6f}  {y:12.6f}  {d:.2e}")
    print(f"tokens/s (median step after the first): longattn {rates['longattn']:.0f}, PyTorch {rates['pytorch']:.0f} "
          f"(longattn / PyTorch {rates['longattn'] / rates['pytorch']:.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "torch": torch.__version__, "longattn_losses": ours, "pytorch_losses": theirs,
                       "relative_differences": differences, "tokens_per_second": rates,
                       "longattn_step_seconds": ours_seconds, "pytorch_step_seconds": torch_seconds}, f, indent=1)
    if max(differences) > tolerance:
        sys.exit(f"losses differ by up to {max(differences):.2e}, more than {tolerance:.0e}")


if __name__ == "__main__":
    main()
