#!/usr/bin/env bash
# Runs a comparison script (compare_sdpa.py, compare_block_sparse.py, compare_dilated.py,
# compare_python.py, compare_train.py, reference_train.py) with torch from PyPI in a
# private virtual environment, created on first use under the build directory (PyPI's torch
# wheel brings its CUDA libraries, about 3 GB, though only the CPU is used; einops and
# torchscale are what dilated-attention-pytorch imports). torch is never a dependency of longattn.
#
#   perf_tests/with_torch.sh <build-dir> <script.py> [script options...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: perf_tests/with_torch.sh <build-dir> <script.py> [options...]" >&2; exit 2; }
build_dir=$(cd "$1" && pwd); script=$2; shift 2
bench="$build_dir/perf_tests/longattn_bench_attention"
[ -x "$bench" ] || { echo "no $bench: configure with -DLONGATTN_ENABLE_BENCHMARKS=ON and build" >&2; exit 1; }
venv="$build_dir/compare-venv"
if ! "$venv/bin/python" -c "import torch, einops, torchscale" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch numpy einops torchscale
fi
# compare_python.py measures longattn's Python package: `pip install` of this clone (README, "Python").
if [[ $script == *compare_python.py ]] && ! "$venv/bin/python" -c "import longattn" 2>/dev/null; then
  CMAKE_PREFIX_PATH=$("$root/scripts/install-deps.sh" | tail -n 1) "$venv/bin/pip" install --quiet "$root"
fi
case $script in */*) ;; *) script="$root/perf_tests/$script" ;; esac
exec "$venv/bin/python" "$script" --bench "$bench" "$@"
