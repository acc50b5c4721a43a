#!/usr/bin/env bash
# Builds the CUDA variant of longattn and runs every test labelled `device` on the GPU: the
# pool, the attention kernels (the GPU's tile shape, 128 threads per team), and on Kokkos::Cuda
# through NCCL the communicator, ring and distributed dilated attention, the gradient buckets
# and training steps, at 1 MPI rank and, with two GPUs, at 2.
#
#   scripts/test-device.sh [build-dir (default build/device)]
#
# Needs an NVIDIA GPU of compute capability 9.0 (Hopper: Kokkos is built for HOPPER90, sm_90),
# CUDA 12 or 13 in /usr/local/cuda, and NCCL; the rest comes from scripts/install-deps.sh --cuda.
# When it passes, its last lines are ctest's
#   100% tests passed, 0 tests failed out of N
#   Label Time Summary: ... device = ...
# followed by "device tests passed on <GPU name>". No GPU: it says so and exits 2.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build/device}

if ! gpus=$(nvidia-smi -L 2> /dev/null) || [ -z "$gpus" ]; then
  echo "test-device: no NVIDIA GPU visible (nvidia-smi -L lists none); the host's tests are" \
       "scripts/build-and-test.sh" >&2
  exit 2
fi
gpu_count=$(echo "$gpus" | wc -l)
echo "test-device: $gpu_count GPU(s):"
echo "$gpus"

LONGATTN_CUDA=1 LONGATTN_TARGETS="longattn_memory_tests longattn_core_tests longattn_parallel_tests longattn_train_tests" \
  "$root/scripts/build.sh" "$build" -DLONGATTN_WARNINGS_AS_ERRORS=ON -DLONGATTN_ENABLE_NCCL=ON \
  -DLONGATTN_ENABLE_BENCHMARKS=OFF

# One GPU per rank (NCCL refuses two ranks on one device): Kokkos picks device local_rank % N.
export KOKKOS_NUM_DEVICES=$gpu_count
exclude=()
if [ "$gpu_count" -lt 2 ]; then
  echo "test-device: SKIP parallel_np2, train_np2: 2 ranks need 2 GPUs"
  exclude=(-E '^(parallel|train)_np2$')
fi
ctest --test-dir "$build" -L device "${exclude[@]}" --output-on-failure
echo "device tests passed on $(echo "$gpus" | head -n 1)"
