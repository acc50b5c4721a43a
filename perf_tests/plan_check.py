#!/usr/bin/env python3
"""longattn-plan's memory per rank against longattn-train's on random (model, layout) pairs.

A seeded generator draws valid longattn-train runs over its options - layers, embedding size,
heads, context, attention kind (dense, LongNet dilated, block-sparse patterns), dp x cp x tp on
1-4 ranks, ZeRO 0-2, precision, recomputation, micro-batches, sequence parallelism, the
gradient reduction's type - runs each for 2 steps, and compares the trainer's pool high-water
by category (memory::Category: parameters, gradients, optimizer states, communication buffers,
activations, workspaces, transient copies) with the planner's terms of the same names, which
the trainer's JSON carries (apps/train/include/longattn/train/prediction.hpp). Prints each case,
its worst category, then the worst miss per category and of the whole. Exit status 1 when a
case's whole misses by more than --tolerance (the issue's target: 10%).

With --calibration (perf_tests/write_calibration.py's JSON, written on this machine just before)
each case runs 5 steps, and the planner's compute time per step (matrix products at the
calibration's efficiency for their shapes, attention at its kind's, head dimension's and
length's, the element-wise kernels at their measured cost per element) is compared with the
median of steps 2-5 less the communication the trainer measured, in the fastest of --repeats
runs of the case (default 3): on a shared virtual machine a whole run slows by up to 40% for
seconds at a time while its steps stay alike (a neighbour's cache and memory traffic, which
the FMA probe does not see), and the calibration takes its fastest of three likewise. A case of
fewer ranks than cores runs as cores / ranks copies at once, their mean taken: every core
computes, as in a job that fills its nodes and as the calibration measured (one rank alone ran
its element-wise kernels 1.2-1.5x faster than two at once on this 2-core guest). Every
rank runs one OpenMP thread (as the calibration
measured) and the trainer measures the ranks' FMA peak itself as each run starts, so that the
prediction follows a virtual machine's clock, which drifts by 10-30% over minutes, and its
element-wise rate (a LayerNorm), by which it scales the calibration's element costs (printed
against the calibration's own: a neighbour's cache and memory traffic moves it). Only runs
with a core for each rank are compared: ranks sharing a core compute faster while a peer waits
in communication, so their step less communication is no rank's compute alone (on 2 cores, 3
and 4 ranks measured 0.45-0.75 of the prediction).

    plan_check.py build/test/apps/train/longattn-train [--seed S] [--cases 40] [--tolerance 0.10]
                  [--calibration calibration.json [--repeats 3]]

Without --seed a fresh one is drawn and printed: `--seed S --cases N` repeats any run.
"""
import argparse
import json
import random
import statistics
import sys

from train_runs import run_copies, run_training

CATEGORIES = ["parameters", "gradients", "optimizer states", "communication buffers", "activations",
              "workspaces", "transient copies"]
MIB = 1 << 20
# Below this the relative miss of a category is not reported (a few KiB of norms or biases).
SMALL_BYTES = 64 << 10


def draw_attention(rng, context, heads, cp):
    """An attention spec the trainer takes for this context, head count and cp."""
    kind = rng.choice(["dense", "dense", "dilated", "block_sparse"])
    if kind == "dense":
        return "dense"
    if kind == "dilated":
        # LongNet levels w = w0 2^i, r = 2^i up to the context; segments divide the context.
        w0 = rng.choice([64, 128, 256])
        lengths, rates = [], []
        w, r = w0, 1
        while w <= context and len(lengths) < 4:
            lengths.append(w)
            rates.append(r)
            w, r = 2 * w, 2 * r
        if not lengths:
            return "dense"
        return "dilated:w=" + ",".join(map(str, lengths)) + ";r=" + ",".join(map(str, rates))
    patterns = ["local_window", "dilated", "global_local", "random"] + (["top_k"] if cp == 1 else [])
    pattern = rng.choice(patterns)
    if pattern == "local_window":
        return f"block_sparse:pattern=local_window;radius={rng.choice([64, 128, 256])}"
    if pattern == "dilated":
        return "block_sparse:pattern=dilated;rates=1,2,4"
    if pattern == "global_local":
        return f"block_sparse:pattern=global_local;radius=128;global={rng.choice([32, 64])}"
    if pattern == "random":
        return f"block_sparse:pattern=random;density={rng.choice([0.1, 0.25, 0.5])}"
    return f"block_sparse:pattern=top_k;k={rng.choice([2, 4])}"


def draw_case(rng):
    """(ranks, longattn-train options) of one valid run."""
    while True:
        ranks = rng.choice([1, 2, 2, 3, 4, 4])
        layers = rng.choice([1, 2, 3, 4])
        embed = rng.choice([64, 128, 192, 256])
        heads = rng.choice([h for h in [1, 2, 4, 8] if embed % h == 0 and embed // h <= 128])
        context = rng.choice([128, 256, 512, 1024, 2048])
        tp = rng.choice([t for t in [1, 2, 4] if ranks % t == 0 and heads % t == 0])
        # A context-parallel rank holds whole 64-token blocks: 2 cp of them (zigzag) at least.
        cp = rng.choice([c for c in [1, 2, 4] if (ranks // tp) % c == 0 and context % (2 * c * 64) == 0])
        dp = ranks // (tp * cp)
        attention = draw_attention(rng, context, heads, cp)
        if tp > 1 and attention.startswith("dilated"):
            attention = "dense"  # the trainer splits the heads of dense and block-sparse attention only
        precision = rng.choice(["fp32", "bf16", "fp16"])
        if "top_k" in attention and precision != "fp32":
            precision = "fp32"  # top-k's block scores are computed in float
        per_rank = rng.choice([1, 2, 4])
        batch = dp * per_rank
        if batch * context > 16384:  # a few seconds per step on two cores
            continue
        micro_batch = rng.choice([m for m in [0, 1, 2] if m == 0 or per_rank % m == 0])
        sequence_parallel = tp > 1 and rng.random() < 0.5 and (context // cp) % tp == 0
        options = ["--layers", layers, "--embed", embed, "--heads", heads, "--context", context,
                   "--attention", attention, "--batch", batch, "--micro-batch", micro_batch,
                   "--tp", tp, "--cp", cp, "--zero", rng.choice([0, 1, 2]),
                   "--precision", precision,
                   "--recompute", rng.choice(["none", "selective", "full"]),
                   "--grad-reduce", rng.choice(["fp32", "model"]),
                   "--positions", rng.choice(["learned", "rotary"]),  # every head dim drawn is even
                   "--task", "long_range"]
        if sequence_parallel:
            options.append("--sequence-parallel")
        return ranks, [str(o) for o in options]


def describe(ranks, options):
    o = dict(zip(options[::2], options[1::2]))
    text = (f"{ranks} ranks tp {o['--tp']} cp {o['--cp']}{' sp' if '--sequence-parallel' in options else ''} "
            f"ZeRO {o['--zero']} | L {o['--layers']} E {o['--embed']} H {o['--heads']} N {o['--context']} "
            f"batch {o['--batch']}/mb {o['--micro-batch']} | {o['--precision']} {o['--recompute']} "
            f"reduce {o['--grad-reduce']} | {o['--positions']} positions, {o['--attention']}")
    return text


def steady_compute(trainer):
    """The median of a run's steps after the first, each less the communication it measured (s)."""
    return statistics.median(s["seconds"] * (1 - s["communication_share"]) for s in trainer["steps"][1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("program", help="the longattn-train binary")
    parser.add_argument("--seed", type=int, help="the generator's seed (default: a fresh one, printed)")
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--tolerance", type=float, default=0.10, help="largest whole miss that passes")
    parser.add_argument("--calibration", help="write_calibration.py's JSON: compare compute time too")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each compared case, the fastest taken")
    options = parser.parse_args()
    timed = ["--calibration", options.calibration] if options.calibration else []
    cores, element_rates = 0, {}
    if options.calibration:
        with open(options.calibration) as f:
            calibration = json.load(f)
        cores, element_rates = calibration["cores"], calibration.get("element_rates", {})
    times = []
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"plan_check.py --seed {seed} --cases {options.cases}", flush=True)
    rng = random.Random(seed)
    worst = {name: (0.0, None) for name in CATEGORIES + ["whole"]}
    misses = []
    for case in range(1, options.cases + 1):
        ranks, args = draw_case(rng)
        j = run_training(options.program, ranks, ["--steps", "5" if timed else "2"] + args + timed, "plan_check.py", threads=1,
                         peak_gflops=None if timed else 1)
        predicted, measured = j["predicted_memory"], j["summary"]["memory_by_category"]
        whole = j["summary"]["memory_bytes"] / j["predicted_memory_bytes"]
        misses.append(abs(whole - 1))
        if abs(whole - 1) > abs(worst["whole"][0] - 1) or worst["whole"][1] is None:
            worst["whole"] = (whole, case)
        parts = []
        for name in CATEGORIES:
            p, m = predicted.get(name, 0.0), measured.get(name, 0)
            if max(p, m) < SMALL_BYTES:
                continue
            ratio = m / p if p > 0 else float("inf")
            parts.append(f"{name} {m / MIB:.2f}/{p / MIB:.2f}")
            if worst[name][1] is None or abs(ratio - 1) > abs(worst[name][0] - 1):
                worst[name] = (ratio, case)
        print(f"case {case:3d}: {describe(ranks, args)}\n"
              f"          whole {j['summary']['memory_bytes'] / MIB:.2f} MiB measured / "
              f"{j['predicted_memory_bytes'] / MIB:.2f} predicted = {whole:.3f}; by category (MiB, measured/"
              f"predicted): {', '.join(parts)}", flush=True)
        if abs(whole - 1) > 0.05:  # what the measured peak was made of: the moment the planner must find
            at_peak = j["summary"]["memory_at_peak"]
            print("          at the measured peak (MiB): " + ", ".join(
                f"{name} {at_peak[name] / MIB:.2f}" for name in CATEGORIES if at_peak.get(name, 0) >= SMALL_BYTES), flush=True)
        if timed:
            # A compared case runs as cores // ranks copies at once (every core computing, as the
            # calibration measured), --repeats times; a run's figures are its copies' means.
            copies = max(1, cores // ranks)
            runs = [[j]] if copies == 1 else []
            while len(runs) < (options.repeats if ranks <= cores else 1):
                runs.append(run_copies(options.program, ranks, ["--steps", "5"] + args + timed, "plan_check.py",
                                       threads=1, peak_gflops=None, copies=copies))
            measured = [statistics.mean(steady_compute(c) for c in run) for run in runs]
            fastest = min(range(len(runs)), key=lambda r: measured[r])
            m_time = measured[fastest]
            p_time = statistics.mean(c["predicted_compute_seconds"] for c in runs[fastest])
            parts = ", ".join(f"{name} {seconds:.3f}" for name, seconds in runs[fastest][0]["predicted_compute_parts"].items())
            if ranks <= cores:
                times.append(m_time / p_time)
            runs_text = f" (fastest of {', '.join(f'{m:.3f}' for m in measured)})" if len(runs) > 1 else ""
            copies_text = f"; {copies} copies at once" if copies > 1 else ""
            precision = dict(zip(args[::2], args[1::2]))["--precision"]
            if precision in element_rates:  # the element costs are scaled by its inverse
                copies_text += (f"; element probe {runs[fastest][0]['element_rate'] / element_rates[precision]:.2f} "
                                "of the calibration's")
            print(f"          compute {m_time:.3f} s measured{runs_text} / {p_time:.3f} s predicted ({parts}) = "
                  f"{m_time / p_time:.2f} (communication {100 * j['summary']['steady_communication_share']:.0f}% "
                  f"of the step{copies_text})" + ("" if ranks <= cores else f"; not compared: {ranks} ranks share {cores} cores"),
                  flush=True)
    print("\nworst miss per category (measured / predicted, case):")
    for name, (ratio, case) in worst.items():
        if case is not None:
            print(f"  {name:22s} {ratio:6.3f}  (case {case})")
    if times:
        within = sum(abs(t - 1) <= 0.25 for t in times)
        print(f"  compute time           {min(times):.2f}-{max(times):.2f}; {within} of {len(times)} within 25% "
              f"(the cases of at most {cores} ranks)")
    within5 = sum(m <= 0.05 for m in misses)
    print(f"whole: {len(misses) - sum(m > options.tolerance for m in misses)} of {len(misses)} cases within "
          f"{100 * options.tolerance:.0f}%, {within5} within 5%; seed {seed}")
    sys.exit(1 if any(m > options.tolerance for m in misses) else 0)


if __name__ == "__main__":
    main()
