#!/usr/bin/env bash
# Installs the dependencies (cached), then configures and builds longattn.
#
#   scripts/build.sh <build-dir> [extra CMake arguments...]
#
# With LONGATTN_CUDA=1 it builds the CUDA variant (Kokkos CUDA + HOPPER90 through nvcc_wrapper),
# with LONGATTN_HIP=1 the HIP variant (Kokkos HIP + VEGA90A through hipcc: AMD MI200 GPUs);
# LONGATTN_TARGETS="t1 t2" builds only those targets.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: scripts/build.sh <build-dir> [cmake args...]" >&2; exit 2; }
build_dir=$1; shift

deps_args=()
cmake_args=()
if [ "${LONGATTN_CUDA:-0}" = 1 ] && [ "${LONGATTN_HIP:-0}" = 1 ]; then
  echo "scripts/build.sh: LONGATTN_CUDA=1 and LONGATTN_HIP=1 name two GPU variants; a build is one" >&2
  exit 2
fi
if [ "${LONGATTN_CUDA:-0}" = 1 ]; then
  deps_args+=(--cuda)
elif [ "${LONGATTN_HIP:-0}" = 1 ]; then
  deps_args+=(--hip)
fi
deps=$("$root/scripts/install-deps.sh" "${deps_args[@]}" | tail -n 1)
if [ "${LONGATTN_CUDA:-0}" = 1 ]; then
  export NVCC_WRAPPER_DEFAULT_ARCH=sm_90 PATH="/usr/local/cuda/bin:$PATH"
  cmake_args+=(-DLONGATTN_ENABLE_CUDA=ON "-DCMAKE_CXX_COMPILER=$deps/bin/nvcc_wrapper")
elif [ "${LONGATTN_HIP:-0}" = 1 ]; then
  # hipcc links for the GPUs that rocm_agent_enumerator finds unless told (a machine without one
  # prints its Python traceback at every link): the compile steps' gfx90a.
  export HCC_AMDGPU_TARGET=${HCC_AMDGPU_TARGET:-gfx90a}
  cmake_args+=(-DLONGATTN_ENABLE_HIP=ON -DCMAKE_CXX_COMPILER=hipcc)
fi

# ccache, where installed: paths under the repository are hashed relative to it, so a fresh
# clone reuses what an earlier one compiled. LONGATTN_CCACHE=0 turns it off. nvcc_wrapper takes
# GCC's options; ccache's depend mode hashes every file its dependency list names (never the
# host-only preprocessor output, which would miss a change inside `#ifdef __CUDA_ARCH__`).
if [ "${LONGATTN_CCACHE:-1}" = 1 ] && command -v ccache > /dev/null; then
  export CCACHE_BASEDIR="$root"
  # The sanitizer builds carry debug info (-g1): without this, ccache hashes the build folder's
  # absolute path into them and a fresh clone elsewhere misses (debug info then names the first
  # clone's folder, which only a debugger reads).
  export CCACHE_NOHASHDIR=1
  cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  if [ "${LONGATTN_CUDA:-0}" = 1 ]; then
    export CCACHE_COMPILERTYPE=gcc CCACHE_DEPEND=1
  fi
fi
cmake -S "$root" -B "$build_dir" "-DCMAKE_PREFIX_PATH=$deps" "${cmake_args[@]}" "$@" >&2
targets=()
for t in ${LONGATTN_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}" >&2
