#!/usr/bin/env python3
"""PNG plots of longattn_bench_attention's JSON output (and compare_sdpa.py's, for SDPA's line).

  python3 perf_tests/plot_results.py --bench run.json [more.json ...] [--sdpa sdpa.json ...]
                                     [--out-dir perf_tests/plots]

Writes, for what the inputs hold:
  attention_gflops.png      GFLOP/s against N, forward and forward + backward, D = 64 and 128,
                            causal and not, fp32 (and bf16 where measured); SDPA's points from
                            compare_sdpa.py --json files; the FMA peak of the run as a line.
  dilated_time.png          dilated attention's time against N beside dense attention's.
  block_sparse_time.png     block-sparse time against the density of kept blocks, dense as a line.

Benchmark files come from `longattn_bench_attention --benchmark_format=json` (several runs
with different --benchmark_filter may be given; a later file's result for the same benchmark
wins). Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import argparse
import json
import os
import re
from collections import defaultdict


def load_benchmarks(paths):
    """{name: benchmark} over the files, and the FMA peak (GFLOP/s) the last file measured."""
    runs, peak = {}, None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        value = data.get("context", {}).get("fp32_fma_peak_all_cores_gflops")
        if value is not None:
            peak = float(value)
        for b in data.get("benchmarks", []):
            runs[b["name"]] = b
    return runs, peak


def seconds(b):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
    return b["real_time"] * scale


def parse(runs, pattern):
    """[(groups..., benchmark)] for the names that match `pattern` (a regex with groups)."""
    out = []
    for name, b in runs.items():
        m = re.match(pattern, name)
        if m:
            out.append((*m.groups(), b))
    return out


MODES = {"Forward": "forward", "ForwardBackward": "forward+backward"}  # benchmark name -> mode
# One color per library and type; causal runs dashed.
COLORS = {"longattn fp32": "tab:red", "longattn bf16": "tab:orange", "SDPA fp32": "tab:blue", "SDPA bf16": "tab:cyan"}


def plot_attention(plt, runs, peak, sdpa_rows, out_dir):
    types = {"float": "fp32", "longattn::bfloat16": "bf16"}
    points = defaultdict(list)  # (mode, D, causal, label) -> [(N, GFLOP/s)]
    for kind, dtype, n, d, causal, b in parse(runs, r"BM_Attention(Forward|ForwardBackward)<([\w:]+)>/(\d+)/(\d+)/(\d)/"):
        points[(MODES[kind], int(d), causal == "1", f"longattn {types.get(dtype, dtype)}")].append((int(n), b["FLOP/s"] * 1e-9))
    for row in sdpa_rows:
        label = f"SDPA {row.get('dtype', 'fp32')}"
        points[(row["mode"], row["head_dim"], row["causal"], label)].append((row["tokens"], row["sdpa_gflops"]))
    if not points:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for col, mode in enumerate(["forward", "forward+backward"]):
        for row, d in enumerate([64, 128]):
            ax = axes[row][col]
            for (m, dd, causal, label), values in sorted(points.items(), key=lambda kv: str(kv[0])):
                if m != mode or dd != d:
                    continue
                values.sort()
                ax.plot([n for n, _ in values], [g for _, g in values], marker="o",
                        linestyle="--" if causal else "-", color=COLORS.get(label),
                        label=f"{label}{', causal' if causal else ''}")
            if peak:
                ax.axhline(peak, color="black", linewidth=1, label=f"fp32 FMA peak {peak:.0f}")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"{mode}, D = {d}")
            ax.set_xlabel("N (tokens)")
            ax.set_ylabel("GFLOP/s")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("Fused attention, B = 1, H = 8 (counted FLOPs: forward 4 B H N^2 D, backward 2.5x)")
    fig.tight_layout()
    path = os.path.join(out_dir, "attention_gflops.png")
    fig.savefig(path, dpi=110)
    return path


def save_seconds_plot(fig, ax, title, xlabel, path):
    """Labels a plot of seconds (log scale) and writes it; returns the path."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("seconds")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_dilated(plt, runs, out_dir):
    series = defaultdict(list)
    for kind, n, mode, b in parse(runs, r"BM_Dilated(Forward|ForwardBackward)/(\d+)/(\d)/0/"):
        label = f"dilated {'longnet' if mode == '0' else 'head_groups'}, {MODES[kind]}"
        series[label].append((int(n), seconds(b)))
    if not series:
        return None
    for kind, n, b in parse(runs, r"BM_Attention(Forward|ForwardBackward)<float>/(\d+)/64/0/"):
        series[f"dense, {MODES[kind]}"].append((int(n), seconds(b)))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for label, values in sorted(series.items()):
        values.sort()
        ax.plot([n for n, _ in values], [s for _, s in values], marker="o",
                linestyle="--" if label.startswith("dense") else "-", label=label)
    ax.set_xscale("log", base=2)
    return save_seconds_plot(fig, ax, "Dilated (w = 2048, 4096, 8192; r = 1, 2, 4) vs dense attention, B = 1, H = 8, "
                             "D = 64", "N (tokens)", os.path.join(out_dir, "dilated_time.png"))


def plot_block_sparse(plt, runs, out_dir):
    series = defaultdict(list)
    for kind, n, density, b in parse(runs, r"BM_BlockSparse(Forward|ForwardBackward)/(\d+)/0/(\d+)/"):
        series[(kind, int(n))].append((int(density), seconds(b)))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for (kind, n), values in sorted(series.items()):
        values.sort()
        line, = ax.plot([d for d, _ in values], [s for _, s in values], marker="o", label=f"N = {n}, {MODES[kind]}")
        dense = next((b for bench, b in runs.items() if bench.startswith(f"BM_Attention{kind}<float>/{n}/64/0/")), None)
        if dense:
            ax.axhline(seconds(dense), color=line.get_color(), linestyle=":", linewidth=1,
                       label=f"dense N = {n}, {MODES[kind]}")
    return save_seconds_plot(fig, ax, "Block-sparse attention, B = 1, H = 8, D = 64",
                             "kept key blocks (% of all, random pattern)",
                             os.path.join(out_dir, "block_sparse_time.png"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", nargs="+", required=True, help="longattn_bench_attention JSON files")
    parser.add_argument("--sdpa", nargs="*", default=[], help="compare_sdpa.py --json files")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "plots"))
    args = parser.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, peak = load_benchmarks(args.bench)
    sdpa_rows = []
    for path in args.sdpa:
        with open(path) as f:
            sdpa_rows += json.load(f)["rows"]
    os.makedirs(args.out_dir, exist_ok=True)
    written = [plot_attention(plt, runs, peak, sdpa_rows, args.out_dir), plot_dilated(plt, runs, args.out_dir),
               plot_block_sparse(plt, runs, args.out_dir)]
    written = [p for p in written if p]
    if not written:
        raise SystemExit("no attention, dilated or block-sparse benchmark in the given files")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
