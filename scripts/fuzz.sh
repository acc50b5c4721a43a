#!/usr/bin/env bash
# Builds the libFuzzer targets (unit_tests/fuzz: attention specs, block-sparse layouts, checkpoint
# files as raw bytes and field by field, JSON configs, the planner's inputs) with Clang,
# AddressSanitizer and UBSan, coverage on all of longattn, then runs each for SECONDS on its seed
# corpus (unit_tests/fuzz/corpus/<target>, read) and a working corpus (build/fuzz/corpus/<target>,
# where new inputs go), as many at once as there are cores.
# A crash, sanitizer report, leak, timeout or out-of-memory stops that target with its input in
# build/fuzz/artifacts/ and makes the script fail.
#
#   scripts/fuzz.sh [seconds per target (default 60)] [target...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(attention_spec block_sparse checkpoint checkpoint_fields config plan)
if ! command -v clang++ > /dev/null || [ ! -f "$(clang++ -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]; then
  apt-get install -y --no-install-recommends clang > /dev/null
fi
build=$root/build/fuzz
LONGATTN_TARGETS="${targets[*]/#/fuzz_}" "$root/scripts/build.sh" "$build" \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  -DLONGATTN_ENABLE_FUZZERS=ON -DLONGATTN_SANITIZE=address,undefined,fuzzer-no-link \
  -DLONGATTN_ENABLE_TESTS=OFF -DLONGATTN_ENABLE_BENCHMARKS=OFF -DLONGATTN_WARNINGS_AS_ERRORS=ON

run() {
  local target=$1
  mkdir -p "$build/corpus/$target" "$build/artifacts"
  local dict=()  # JSON's tokens for the targets that read JSON
  case $target in checkpoint|config) dict=(-dict="$root/unit_tests/fuzz/json.dict") ;; esac
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 OMP_NUM_THREADS=1 \
    "$build/unit_tests/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" "${dict[@]}" \
    "$build/corpus/$target" "$root/unit_tests/fuzz/corpus/$target" > "$build/$target.log" 2>&1
}
failed=()
pids=()
names=()
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 1; done
  run "$target" &
  pids+=($!)
  names+=("$target")
done
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then status=ok; else status=FAILED; failed+=("${names[$i]}"); fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/${names[$i]}.log" | grep -o '[0-9]*$' || echo "?")
  printf 'fuzz_%-16s %s: %s inputs in %s s (log: build/fuzz/%s.log)\n' "${names[$i]}" "$status" "$runs" "$seconds" "${names[$i]}"
done
if [ ${#failed[@]} -gt 0 ]; then
  for t in "${failed[@]}"; do tail -n 40 "$build/$t.log"; done
  exit 1
fi
