#!/usr/bin/env bash
# After the SDPA grid: the block products alone on one core, then bf16 attention on the dot products against float values (N 4K, forward and fwd+bwd, D 64/128, not causal), alternated twice.
set -x
B=/work/exp/b-head/perf_tests
O=/work/exp/runs/after
mkdir -p $O
export OMP_PROC_BIND=false
$B/longattn_bench_ceilings --benchmark_filter='BM_FloatBlockProduct|BM_Bf16PairProduct|BM_FmaPeak<Kokkos::Serial>' --benchmark_repetitions=3 --benchmark_out=$O/block-products.json --benchmark_out_format=json > $O/block-products.txt 2>&1
F='BM_Attention(Forward|ForwardBackward)<longattn::bfloat16>/4096/(64|128)/0/real_time'
for r in 1 2; do
  for d in 1 0; do
    LONGATTN_BF16_DOT_PRODUCTS=$d OMP_NUM_THREADS=2 $B/longattn_bench_attention --benchmark_filter="$F" --benchmark_out=$O/bf16-dot$d-round$r.json --benchmark_out_format=json > $O/bf16-dot$d-round$r.txt 2>&1
  done
done
echo finished
