#!/usr/bin/env bash
# The SDPA comparison on this CPU: longattn-info before, between and after; fp32 grid; bf16 forward; bf16 fwd+bwd at 4K.
set -x
cd /work/main/perf_tests
PY=/work/compare-venv/bin/python
B=/work/exp/b-head/perf_tests/longattn_bench_attention
I=/work/exp/b-head/apps/info/longattn-info
O=/work/exp/runs/sdpa
export OMP_PROC_BIND=false
$I > $O/info-before.txt 2>&1
$PY compare_sdpa.py --bench $B --threads 2 --tokens 1024 4096 16384 --json $O/fp32.json > $O/fp32.log 2>&1
$I > $O/info-between.txt 2>&1
$PY compare_sdpa.py --bench $B --threads 2 --tokens 4096 16384 --dtypes bf16 --modes forward --json $O/bf16-forward.json > $O/bf16-forward.log 2>&1
$PY compare_sdpa.py --bench $B --threads 2 --tokens 4096 --head-dims 64 --dtypes bf16 --modes forward+backward --json $O/bf16-fwd-bwd.json > $O/bf16-fwd-bwd.log 2>&1
$I > $O/info-after.txt 2>&1
echo finished
