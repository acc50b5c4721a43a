#!/usr/bin/env bash
# The GPU checks of longattn, prepared on a machine without a GPU and run on a lent one:
#
#   scripts/device-check.sh prepare [bundle.tar.xz]   here: builds the CUDA variant (Release, nvcc,
#       sm_90, NCCL, warnings as errors) into build/device, and packs the test and benchmark
#       programs with the shared libraries a GPU machine's image may lack (Kokkos, longattn,
#       Open MPI with its components, hwloc, OpenBLAS, ...; not the driver, cuBLAS or NCCL, which
#       it has) into one archive, default build/device-bundle.tar.xz (carry it with the call); with
#       them the Python package's CUDA module, built for the GPU machine's Python 3.12
#       ($LONGATTN_DEVICE_PYTHON, default python3.12 on PATH or pyenv's 3.12; nanobind from PyPI)
#   scripts/device-check.sh run [bundle.tar.xz] [kernels|tests|train|all]   on the GPU machine; writes
#       under $OUT (default build/device-out) summary.txt and device-check.tar.gz, which holds
#       gpu.txt, resources.txt, *.log, *.xml (JUnit), sdpa.json, ceilings.json, train_*.json and
#       summary.txt. `kernels` runs steps 1-3 (they took 4 minutes on an H100, 2026-11-27),
#       `tests` steps 1, 4 and 5 (steps 1 and 4 took 1 minute; 5 has not run yet), `train` steps 1
#       and 6 (not run yet in this form), `all` (the default) every step: a call runs 10 minutes
#       at most, so a lent GPU's 15 take `kernels`, `tests` and `train` as three calls, in the
#       order that serves the open issues; $OUT keeps what finished if a call is cut.
#
# run, each step with its own time limit, going on after a failure and saying which failed:
#   1. the GPU (nvidia-smi) and the tensor-core kernels' registers, stack and spills
#      (cuobjdump -res-usage on liblongattn_core.so)
#   2. the tensor-core tests (emulated and on the GPU), and compute-sanitizer memcheck and
#      racecheck on the GPU's (small sizes); memcheck on the linear layers' cuBLASLt epilogues
#   3. the measured bf16 matrix-product ceiling (torch.matmul, 8192^3) and the attention grid beside
#      PyTorch's SDPA (perf_tests/compare_sdpa.py --device cuda: bf16, N 4K and 16K, D 64 and 128,
#      causal or not, forward and forward + backward, 16 heads), with the default programs and with
#      the warpgroup ones (wgmma; sdpa_warpgroup.json)
#   4. every other test on Kokkos::Cuda: core's cases, memory, and at one MPI rank parallel and
#      train; the Python package's tests on torch CUDA tensors (python/tests)
#   5. several ranks on the one GPU: NCCL refuses ranks that share a GPU, so the communicator
#      chooses the staged transport (MPI on host copies); parallel at 2 and 4 ranks, train at 2
#      and the ZeRO / tp cases at 4; longattn-train at cp 2 and at dp 2 with ZeRO 2 (JSON: the
#      share of a step spent in communication the compute did not hide)
#   6. training steps in bf16 (longattn-train, JSON per run): the default model, --model 350m (24
#      layers, E 1024, 16 heads) at context 4096 (GELU after the matmul, then in cuBLASLt's
#      epilogue: LONGATTN_CUBLASLT_GELU=1) and the same beside PyTorch from the same weights
#      and batches (perf_tests/reference_train.py: losses and tokens/s), and the default model on one
#      sequence of 1,048,576 tokens (rotary positions, dilated attention across the whole sequence,
#      full recomputation); issue 47's targets read from the runs' JSON by
#      perf_tests/check_train_run.py (the 1M run's loss falls; memory within 10% of the planner's)
# It exits 0 when every step passed, 1 otherwise, 2 without a GPU.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command=${1:-}
bundle=${2:-$root/build/device-bundle.tar.xz}
steps=${3:-all}
programs=(longattn_core_tests longattn_memory_tests longattn_parallel_tests longattn_train_tests
          longattn_bench_attention longattn-train)

# The interpreter the Python module is built for: the GPU machine's is Python 3.12.
device_python() {
  local python
  for python in ${LONGATTN_DEVICE_PYTHON:-python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12}; do
    if "$python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' > /dev/null 2>&1; then
      echo "$python"
      return 0
    fi
  done
  return 1
}

prepare() {
  set -e
  local build=$root/build/device staging python venv=$root/build/device-python-venv python_flags=() targets=("${programs[@]}")
  if python=$(device_python); then
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -c "import nanobind" 2> /dev/null || "$venv/bin/pip" install --quiet nanobind
    python_flags=(-DLONGATTN_ENABLE_PYTHON=ON "-DPython_EXECUTABLE=$venv/bin/python")
    targets+=(longattn_python)
  else
    echo "device-check: no Python 3.12 here (LONGATTN_DEVICE_PYTHON): the bundle has no Python module," \
         "and the python_cuda step will fail" >&2
  fi
  LONGATTN_CUDA=1 LONGATTN_TARGETS="${targets[*]}" "$root/scripts/build.sh" "$build" \
    -DLONGATTN_WARNINGS_AS_ERRORS=ON -DLONGATTN_ENABLE_NCCL=ON "${python_flags[@]}"
  staging=$(mktemp -d)
  mkdir -p "$staging/bin" "$staging/lib"
  cp "$build/unit_tests/longattn_core_tests" "$build/unit_tests/longattn_memory_tests" \
     "$build/unit_tests/longattn_parallel_tests" "$build/unit_tests/longattn_train_tests" \
     "$build/perf_tests/longattn_bench_attention" "$build/apps/train/longattn-train" "$staging/bin/"
  if [ ${#python_flags[@]} -gt 0 ]; then  # the package as pip would install it: python/longattn/
    mkdir -p "$staging/python/longattn"
    cp "$root"/python/longattn/*.py "$build"/python/_core.*.so "$staging/python/longattn/"
  fi
  # Open MPI: a singleton MPI_Init starts orted, which loads components from its library folder.
  local ompi=/usr/lib/x86_64-linux-gnu/openmpi
  cp -a "$ompi" "$staging/openmpi"
  mkdir -p "$staging/openmpi/bin" "$staging/openmpi/share"
  cp "$(command -v orted)" "$staging/openmpi/bin/"
  cp "$(readlink -f "$(command -v mpiexec)")" "$staging/openmpi/bin/mpiexec"  # several ranks on the one GPU
  cp -a /usr/share/openmpi "$staging/openmpi/share/openmpi"
  # Every library the programs and Open MPI's components load, but those of the C library, the
  # driver and the CUDA libraries the GPU machine's image has.
  local skip='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libcuda|libcublas|libcublasLt|libnccl|libnvidia-.*)\.so'
  { for f in "$staging"/bin/* "$staging"/python/longattn/*.so "$staging"/openmpi/bin/orted "$staging"/openmpi/lib/openmpi3/*.so; do
      [ -e "$f" ] && ldd "$f"
    done; } |
    awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
      if [[ ! $(basename "$lib") =~ $skip ]]; then cp -L "$lib" "$staging/lib/"; fi
    done
  tar -C "$staging" -cf - . | xz -T2 -6 > "$bundle"
  rm -rf "$staging"
  echo "device-check: $(du -h "$bundle" | cut -f1) in $bundle; on the GPU machine: scripts/device-check.sh run $bundle"
}

# step NAME SECONDS COMMAND...: runs the command under a time limit with its output in $OUT/NAME.log.
failed=()
step() {
  local name=$1 limit=$2 began=$SECONDS status
  shift 2
  echo "== $name (at most ${limit} s)"
  timeout --signal=INT --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  status=$?
  tail -n 3 "$out/$name.log"
  echo "== $name: exit $status after $((SECONDS - began)) s"
  printf '%-28s exit %3d  %4d s\n' "$name" "$status" "$((SECONDS - began))" >> "$out/summary.txt"
  [ "$status" -eq 0 ] || failed+=("$name")
  deliver
}

# What comes back from a GPU machine is a few files: the logs travel as one archive, packed again
# after every step so that a call cut short still returns what finished.
deliver() {
  tar -C "$out" -czf "$dest/device-check.tar.gz" .
  cp "$out/summary.txt" "$dest/summary.txt"
}

# runs PART: whether this call's steps ($3: kernels, tests, train or all) include PART.
runs() { [ "$steps" = all ] || [ "$steps" = "$1" ]; }

run() {
  case "$steps" in
    kernels | tests | train | all) ;;
    *) echo "device-check: run's third argument is '$steps'; expected kernels, tests, train or all" >&2; exit 2 ;;
  esac
  dest=${OUT:-$root/build/device-out}
  out=$(mktemp -d)
  mkdir -p "$dest"
  : > "$out/summary.txt"
  if ! nvidia-smi -L > "$out/gpu.txt" 2>&1; then
    echo "device-check: no NVIDIA GPU here (nvidia-smi -L failed)" >&2
    exit 2
  fi
  nvidia-smi >> "$out/gpu.txt" 2>&1
  local here
  here=$(mktemp -d)
  xz -dc "$bundle" | tar -C "$here" -xf -
  # cuBLAS and NCCL from the machine's CUDA or its PyTorch's wheels.
  local cuda_libs
  cuda_libs=$(python3 - << 'EOF'
import glob, os, site
roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"] + [p for s in site.getsitepackages() for p in glob.glob(os.path.join(s, "nvidia", "*", "lib"))]
print(":".join(r for r in roots if os.path.isdir(r)))
EOF
)
  export LD_LIBRARY_PATH="$here/lib:$here/openmpi/lib:$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX=$here/openmpi PATH="$here/openmpi/bin:$PATH"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_opal_prefix=$here/openmpi
  export OMPI_MCA_mca_base_component_path=$here/openmpi/lib/openmpi3 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
  export OMP_PROC_BIND=false KOKKOS_NUM_DEVICES=1
  local bin=$here/bin
  cat "$out/gpu.txt" | head -n 1

  # 1. Registers, stack and spills of every tensor-core kernel (run_program<...Program...>).
  step resources 30 bash -c "cuobjdump -res-usage $here/lib/liblongattn_core.so.* | grep -A1 run_program"
  cp "$out/resources.log" "$out/resources.txt" 2> /dev/null

  # 2. The tensor-core tests (the host's emulation and the GPU) and, on the GPU's instances, under
  #    compute-sanitizer (small sizes). Template test cases over the execution spaces end in " - 1"
  #    for Kokkos::Cuda (Serial is " - 0"; over the tensor-core targets, " - Targets - 1" and
  #    " - Targets - 0"). --warn NoTests: a filter that matches nothing fails.
  if runs kernels; then
    step core_tensor_cores 90 "$bin/longattn_core_tests" --warn NoTests "[tensor_cores]" -r junit \
      -o "$out/core_tensor_cores.xml"
    local gpu_cases="tensor-core attention matches the double reference - Targets - 1,tensor-core attention: the warpgroup programs (wgmma) match the double reference - Targets - 1"
    step memcheck 60 env LONGATTN_TEST_SIZE=small compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$bin/longattn_core_tests" --warn NoTests "$gpu_cases"
    step racecheck 90 env LONGATTN_TEST_SIZE=small compute-sanitizer --tool racecheck --racecheck-report hazard \
      --error-exitcode 1 "$bin/longattn_core_tests" --warn NoTests "$gpu_cases"
    step memcheck_linear 30 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/longattn_core_tests" \
      --warn NoTests "linear_forward and linear_input_gradient match the double reference - 1"

    # 3. The measured bf16 matrix-product ceiling and the grid beside SDPA.
    step ceilings 30 python3 - "$out/ceilings.json" << 'EOF'
import json, sys, torch
a, b = (torch.rand(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(3): a @ b
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20): a @ b
end.record(); torch.cuda.synchronize()
tflops = 20 * 2 * 8192**3 / (start.elapsed_time(end) * 1e-3) * 1e-12
json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, bf16_matmul_tflops=tflops), open(sys.argv[1], "w"))
print(f"bf16 matmul 8192^3: {tflops:.0f} TFLOP/s on {torch.cuda.get_device_name()}")
EOF
    step sdpa 200 python3 "$root/perf_tests/compare_sdpa.py" --device cuda --bench "$bin/longattn_bench_attention" \
      --dtypes bf16 --tokens 4096 16384 --head-dims 64 128 --heads 16 --repeat 1 --json "$out/sdpa.json"
    step sdpa_warpgroup 200 python3 "$root/perf_tests/compare_sdpa.py" --device cuda \
      --bench "$bin/longattn_bench_attention" --program warpgroup --dtypes bf16 --tokens 4096 16384 \
      --head-dims 64 128 --heads 16 --repeat 1 --json "$out/sdpa_warpgroup.json"
  fi

  # 4. Every other test on Kokkos::Cuda: core's cases, memory, and at one MPI rank parallel and train.
  if runs tests; then
    step core_cuda 120 "$bin/longattn_core_tests" --warn NoTests "* - 1" -r junit -o "$out/core_cuda.xml"
    step memory 30 "$bin/longattn_memory_tests" -r junit -o "$out/memory.xml"
    step parallel_np1 45 "$bin/longattn_parallel_tests" --warn NoTests "* - 1" -r junit -o "$out/parallel_np1.xml"
    step train_np1 60 "$bin/longattn_train_tests" -r junit -o "$out/train_np1.xml"
    # The Python package on torch CUDA tensors (its numpy tests say SKIP in a CUDA build).
    step python_cuda 90 env PYTHONPATH="$here/python" python3 -m pytest -rs -q -p no:cacheprovider \
      --junitxml "$out/python_cuda.xml" "$root/python/tests"
  fi

  # 5. Several ranks on the one GPU, through the staged transport (chosen: the ranks share it).
  if runs tests; then
    # A collective that does not finish in 40 s ends its rank with an error (the watchdog) rather
    # than the step's limit ending a hang.
    local mpi=(mpiexec --oversubscribe -x LD_LIBRARY_PATH -x OPAL_PREFIX -x OMPI_MCA_mca_base_component_path
               -x LONGATTN_COLLECTIVE_TIMEOUT=40)
    step parallel_np2 60 "${mpi[@]}" -n 2 "$bin/longattn_parallel_tests" --warn NoTests "* - 1"
    step parallel_np4 90 "${mpi[@]}" -n 4 "$bin/longattn_parallel_tests" --warn NoTests "* - 1"
    step train_np2 45 "${mpi[@]}" -n 2 "$bin/longattn_train_tests"
    step train_np4_zero 45 "${mpi[@]}" -n 4 "$bin/longattn_train_tests" "[zero],[tp]"
    # Exposed communication (the JSON's communication_share) of 2 ranks on the one GPU, bf16.
    step train_cp2 45 "${mpi[@]}" -n 2 "$bin/longattn-train" --precision bf16 --cp 2 --context 2048 --steps 10 \
      --eval-every 0 --eval-batches 1 --warmup 2 --peak-gflops 989000 --json "$out/train_cp2.json"
    step train_dp2_zero2 45 "${mpi[@]}" -n 2 "$bin/longattn-train" --precision bf16 --zero 2 --steps 10 \
      --eval-every 0 --eval-batches 1 --warmup 2 --peak-gflops 989000 --json "$out/train_dp2_zero2.json"
  fi

  # 6. Training steps in bf16 on the GPU (MFU against the datasheet's dense bf16 989 TFLOP/s).
  if runs train; then
    step train_default 60 "$bin/longattn-train" --precision bf16 --steps 20 --peak-gflops 989000 \
      --json "$out/train_default.json"
    step train_350m 150 "$bin/longattn-train" --precision bf16 --model 350m \
      --context 4096 --batch 8 --steps 5 --eval-every 0 --eval-batches 1 --warmup 2 --peak-gflops 989000 \
      --task long_range --json "$out/train_350m.json"
    step train_350m_memory 10 python3 "$root/perf_tests/check_train_run.py" "$out/train_350m.json" --memory-within 0.10
    # The same with GELU and its derivative in cuBLASLt's epilogues (linear.hpp; off by default
    # until this pair of runs says which is faster): step times beside train_350m's.
    step train_350m_gelu_epilogue 90 env LONGATTN_CUBLASLT_GELU=1 "$bin/longattn-train" --precision bf16 \
      --model 350m --context 4096 --batch 8 --steps 5 --eval-every 0 --eval-batches 1 --warmup 2 \
      --peak-gflops 989000 --task long_range --json "$out/train_350m_gelu_epilogue.json"
    # The same 350M model in PyTorch (eager, SDPA) from longattn's initial weights on its batches:
    # the first steps' losses side by side, and each side's tokens/s (perf_tests/reference_train.py).
    step reference_350m 200 python3 "$root/perf_tests/reference_train.py" --device cuda --precision bf16 \
      --program "$bin/longattn-train" --bench "$bin/longattn_bench_attention" --layers 24 --embed 1024 --heads 16 \
      --context 4096 --batch 8 --steps 5 --json "$out/reference_350m.json"
    # A million tokens in one sequence, full recomputation. Rotary positions: learned ones would be
    # 268M of the model's parameters. LongNet's segments 2048 x 4^k up to the whole sequence (each
    # branch 2048 keys a query), so the queries at the end can reach the pairs at the start. 64 pairs
    # and 64 queries: the loss counts the answers, and with one a step it is one token's loss, noise
    # (on a CPU at 64K: 5.53 -> 6.09 over 6 steps; with 64, 5.75 -> 3.80 by step 5).
    step train_1m 240 "$bin/longattn-train" --precision bf16 --task long_range --pairs 64 --queries 64 \
      --context 1048576 --batch 1 --positions rotary \
      --attention "dilated:w=2048,8192,32768,131072,524288,1048576;r=1,4,16,64,256,512" --recompute full \
      --steps 8 --warmup 1 --eval-every 0 --eval-batches 1 --peak-gflops 989000 --json "$out/train_1m.json"
    step train_1m_targets 10 python3 "$root/perf_tests/check_train_run.py" "$out/train_1m.json" \
      --loss-falls 0.5 --memory-within 0.10
  fi

  echo "== summary"
  cat "$out/summary.txt"
  grep -h "ratio\|^forward\|^mode" "$out/sdpa.log" 2> /dev/null | tail -n 25
  rm -rf "$here"
  deliver
  if [ ${#failed[@]} -gt 0 ]; then
    echo "device-check: FAILED: ${failed[*]}"
    exit 1
  fi
  echo "device-check: every step passed on $(head -n 1 "$out/gpu.txt")"
}

case "$command" in
  prepare) prepare ;;
  run) run ;;
  *) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
