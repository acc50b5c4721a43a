# The same as run-per-benchmark.sh with the sides' order swapped (A = this change, B = 5607ce2),
# for four of its benchmarks: whether the side that runs first in a round is the slower one.
P=perf_tests/compare_builds/2026-12-03-avx2-micro-kernel-loads/paired.sh
for b in 'BM_AttentionForward<float>/4096/128/0/' 'BM_AttentionForward<longattn::bfloat16>/4096/64/0/' \
         'BM_AttentionForward<longattn::bfloat16>/4096/64/1/' 'BM_AttentionForwardBackward<longattn::bfloat16>/4096/64/1/'; do
  n=$(echo "$b" | tr -c 'A-Za-z0-9\n' _)
  RAW=/tmp/m/raw-swapped-$n.txt bash $P "^$b" 10 /work/build-after /work/build-before
done
