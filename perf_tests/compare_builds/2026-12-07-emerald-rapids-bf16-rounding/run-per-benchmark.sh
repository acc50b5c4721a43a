# Each benchmark alone through paired.sh (A = 5607ce2, B = this change), 10 rounds, so that
# the two sides of a round run seconds apart on this noisy guest. Steal ticks read around it.
P=perf_tests/compare_builds/2026-12-03-avx2-micro-kernel-loads/paired.sh
grep '^cpu ' /proc/stat > /tmp/m/proc-stat-before.txt
for b in 'BM_AttentionForward<float>/4096/128/0/' 'BM_AttentionForwardBackward<float>/4096/128/0/' \
         'BM_AttentionForward<longattn::bfloat16>/4096/64/0/' 'BM_AttentionForward<longattn::bfloat16>/4096/128/0/' \
         'BM_AttentionForward<longattn::bfloat16>/4096/64/1/' 'BM_AttentionForward<longattn::bfloat16>/4096/128/1/' \
         'BM_AttentionForwardBackward<longattn::bfloat16>/4096/64/0/' 'BM_AttentionForwardBackward<longattn::bfloat16>/4096/128/0/' \
         'BM_AttentionForwardBackward<longattn::bfloat16>/4096/64/1/' 'BM_AttentionForwardBackward<longattn::bfloat16>/4096/128/1/'; do
  n=$(echo "$b" | tr -c 'A-Za-z0-9\n' _)
  RAW=/tmp/m/raw-$n.txt bash $P "^$b" 10 /work/build-before /work/build-after
done
grep '^cpu ' /proc/stat > /tmp/m/proc-stat-after.txt
