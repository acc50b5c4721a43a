#!/usr/bin/env bash
# The main job: builds longattn (Release) and runs longattn-info under mpiexec, which prints
# the build, the machine as hwloc sees it, where the ranks run and the measured FP32 FMA and
# sgemm ceilings of this machine. The report is also written to build/release/longattn-info.json.
#
#   scripts/run-main-job.sh [ranks (default 2)] [longattn-info options...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ranks=${1:-2}
[ $# -gt 0 ] && shift
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || { echo "run-main-job.sh: ranks must be a positive integer, got '$ranks'" >&2; exit 2; }

build="$root/build/release"
"$root/scripts/build.sh" "$build" -DLONGATTN_ENABLE_TESTS=OFF -DLONGATTN_ENABLE_BENCHMARKS=OFF

# Unbound OpenMP threads: OpenBLAS' own threads then share the cores best (measured).
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
mpi_flags=()
mpi_version=$(mpiexec --version 2>&1 || true)
if [[ "$mpi_version" == *"Open MPI"* || "$mpi_version" == *OpenRTE* ]]; then
  # Rank 0 measures on all cores of the node; Open MPI would bind it to one.
  mpi_flags+=(--bind-to none --oversubscribe -x OMP_PROC_BIND)
  if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fi
exec mpiexec -n "$ranks" "${mpi_flags[@]}" "$build/apps/info/longattn-info" --json "$build/longattn-info.json" "$@"
