#!/bin/bash
# BEFORE_LIB: a folder holding the before build's liblongattn_core.so.0.1; BEFORE_BIN, AFTER_BIN: the two longattn_bench_attention
# alternate before/after, one core, bf16 forward
F="$1"; R=${2:-5}
for i in $(seq $R); do
  for side in before after; do
    if [ $side = before ]; then LD="$BEFORE_LIB"; B="$BEFORE_BIN"; else LD=; B="$AFTER_BIN"; fi
    LD_LIBRARY_PATH=$LD OMP_NUM_THREADS=1 taskset -c 0 $B --benchmark_filter="$F" --benchmark_min_time=1 2>/dev/null | grep '^BM_' | awk -v s=$side '{print s, $1, $2}'
  done
done
