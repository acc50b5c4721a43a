# run-per-benchmark.sh FIRST SECOND PREFIX BENCHMARK...: each benchmark alone through paired.sh,
# 10 rounds, FIRST's build before SECOND's in each round, so the two sides of a round run seconds
# apart on this noisy guest; each benchmark's rounds go to /tmp/m/PREFIX<its name>.txt.
first=$1 second=$2 prefix=$3; shift 3
mkdir -p /tmp/m
for b in "$@"; do
  n=$(echo "$b" | tr -c 'A-Za-z0-9\n' _)
  RAW=/tmp/m/$prefix$n.txt bash perf_tests/compare_builds/2026-12-03-avx2-micro-kernel-loads/paired.sh "^$b" 10 "$first" "$second"
done
