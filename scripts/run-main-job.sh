#!/usr/bin/env bash
# The main job: builds longattn (Release) and trains the default model with longattn-train under
# mpiexec: a 4-layer byte-level transformer (3.4M parameters, dense causal attention, 256-token
# context) on the GPL-3 text, 60 AdamW steps, data parallel over the ranks, about a minute on 2
# cores. Each rank gets cores / ranks OpenMP threads (unless OMP_NUM_THREADS is set). The JSON
# summary goes to build/release/longattn-train.json.
#
#   scripts/run-main-job.sh [ranks (default 2)] [longattn-train options...]
#   scripts/run-main-job.sh --steps 3          (options alone: 2 ranks)
#
# The machine report of earlier versions is build/release/apps/info/longattn-info.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ranks=2
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then  # a rank count first
  [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "run-main-job.sh: the first argument is a rank count (a positive integer) or a longattn-train option, got '$1'" >&2; exit 2; }
  ranks=$1
  shift
fi

build="$root/build/release"
"$root/scripts/build.sh" "$build" -DLONGATTN_ENABLE_TESTS=OFF -DLONGATTN_ENABLE_BENCHMARKS=OFF

# Unbound OpenMP threads, each rank its share of the cores: oversubscribed ranks spin in barriers.
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
threads=$(( $(nproc) / ranks ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}
mpi_flags=()
mpi_version=$(mpiexec --version 2>&1 || true)
if [[ "$mpi_version" == *"Open MPI"* || "$mpi_version" == *OpenRTE* ]]; then
  mpi_flags+=(--bind-to none --oversubscribe -x OMP_PROC_BIND -x OMP_NUM_THREADS)
  if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fi
exec mpiexec -n "$ranks" "${mpi_flags[@]}" "$build/apps/train/longattn-train" --json "$build/longattn-train.json" "$@"
