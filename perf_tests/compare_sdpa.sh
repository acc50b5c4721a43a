#!/usr/bin/env bash
# Runs perf_tests/compare_sdpa.py with torch from PyPI in a private virtual environment
# (created on first use under the build directory; PyPI's torch wheel brings its CUDA libraries,
# about 3 GB, though only the CPU is used). torch is never a dependency of longattn.
#
#   perf_tests/compare_sdpa.sh <build-dir> [compare_sdpa.py options...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: perf_tests/compare_sdpa.sh <build-dir> [options...]" >&2; exit 2; }
build_dir=$(cd "$1" && pwd); shift
bench="$build_dir/perf_tests/longattn_bench_attention"
[ -x "$bench" ] || { echo "no $bench: configure with -DLONGATTN_ENABLE_BENCHMARKS=ON and build" >&2; exit 1; }
venv="$build_dir/compare-venv"
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch numpy
fi
exec "$venv/bin/python" "$root/perf_tests/compare_sdpa.py" --bench "$bench" "$@"
