#!/usr/bin/env bash
# Installs the dependencies (cached), then configures and builds longattn.
#
#   scripts/build.sh <build-dir> [extra CMake arguments...]
#
# With LONGATTN_CUDA=1 it builds the CUDA variant (Kokkos CUDA + HOPPER90 through nvcc_wrapper);
# LONGATTN_TARGETS="t1 t2" builds only those targets.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: scripts/build.sh <build-dir> [cmake args...]" >&2; exit 2; }
build_dir=$1; shift

deps_args=()
cmake_args=()
if [ "${LONGATTN_CUDA:-0}" = 1 ]; then
  deps_args+=(--cuda)
fi
deps=$("$root/scripts/install-deps.sh" "${deps_args[@]}" | tail -n 1)
if [ "${LONGATTN_CUDA:-0}" = 1 ]; then
  export NVCC_WRAPPER_DEFAULT_ARCH=sm_90 PATH="/usr/local/cuda/bin:$PATH"
  cmake_args+=(-DLONGATTN_ENABLE_CUDA=ON "-DCMAKE_CXX_COMPILER=$deps/bin/nvcc_wrapper")
fi

# ccache, where installed, for the host compilers (not nvcc): paths under the repository are
# hashed relative to it, so a fresh clone reuses what an earlier one compiled. LONGATTN_CCACHE=0
# turns it off.
if [ "${LONGATTN_CCACHE:-1}" = 1 ] && [ "${LONGATTN_CUDA:-0}" != 1 ] && command -v ccache > /dev/null; then
  export CCACHE_BASEDIR="$root"
  cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$build_dir" "-DCMAKE_PREFIX_PATH=$deps" "${cmake_args[@]}" "$@" >&2
targets=()
for t in ${LONGATTN_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}" >&2
