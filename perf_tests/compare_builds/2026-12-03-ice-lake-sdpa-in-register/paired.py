#!/usr/bin/env python3
"""Paired one-core A/B: alternates two benchmark binaries for N rounds, best of reps each, prints
per-benchmark medians of round ratios (A/B time = speed-up of B)."""
import json, subprocess, sys, statistics, os
a, b, filt, rounds, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
env = dict(os.environ, OMP_NUM_THREADS="1", OMP_PROC_BIND="false")
res = {"a": a, "b": b, "filter": filt, "rounds": []}
def run(binary):
    p = subprocess.run(["taskset", "-c", "0", binary, f"--benchmark_filter={filt}",
                        "--benchmark_repetitions=2", "--benchmark_format=json",
                        "--benchmark_min_time=0.3"], env=env, capture_output=True, text=True, check=True)
    best = {}
    for bm in json.loads(p.stdout)["benchmarks"]:
        if bm.get("run_type") == "aggregate": continue
        n = bm["run_name"]; best[n] = min(best.get(n, 1e30), bm["real_time"])
    return best
for r in range(rounds):
    ta = run(a); tb = run(b)
    res["rounds"].append({"a": ta, "b": tb})
    print(f"round {r}", {k: round(ta[k] / tb[k], 3) for k in ta}, flush=True)
for k in res["rounds"][0]["a"]:
    ratios = [x["a"][k] / x["b"][k] for x in res["rounds"]]
    print(f"{k}: a {min(x['a'][k] for x in res['rounds']):.1f} b {min(x['b'][k] for x in res['rounds']):.1f} "
          f"median {statistics.median(ratios):.3f} range {min(ratios):.3f}-{max(ratios):.3f}")
json.dump(res, open(out, "w"), indent=1)
