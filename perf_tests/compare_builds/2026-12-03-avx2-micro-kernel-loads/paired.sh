#!/usr/bin/env bash
# paired.sh FILTER ROUNDS A B: alternates A and B; per benchmark prints the median and range of
# the per-round ratio time(A)/time(B) (> 1: B faster), and each side's best time.
F=$1; N=$2; A=$3; B=$4
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_PROC_BIND=true
for i in $(seq $N); do for s in A B; do b=${!s}
  taskset -c 0 $b/perf_tests/longattn_bench_attention --benchmark_filter="$F" --benchmark_min_time=0 --benchmark_repetitions=2 --benchmark_report_aggregates_only=false 2>/dev/null | grep "^BM_" | grep -v -E "_(mean|median|stddev|cv)" | awk -v s=$s -v i=$i '{print i, s, $1, $2}'
done; done > ${RAW:-/tmp/paired.txt}
python3 - <<'PY'
import collections, statistics
t=collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(__import__("os").environ.get("RAW","/tmp/paired.txt")):
    i,s,n,v=l.split(); t[n][(int(i),s)].append(float(v))
for n,d in t.items():
    rounds=sorted({i for i,_ in d})
    r=[min(d[(i,'A')])/min(d[(i,'B')]) for i in rounds if (i,'A') in d and (i,'B') in d]
    a=min(min(v) for (i,s),v in d.items() if s=='A'); b=min(min(v) for (i,s),v in d.items() if s=='B')
    print(f"{n:55s} A/B median {statistics.median(r):.3f} range {min(r):.3f}-{max(r):.3f}  best A {a:.0f} B {b:.0f}")
PY
