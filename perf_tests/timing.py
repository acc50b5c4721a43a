"""Timing shared by the comparison scripts."""
import os
import subprocess
import time

# The CPUs this process may run on, taken before torch's OpenMP runtime starts: with
# OMP_PROC_BIND in the environment it binds the script's main thread to one CPU, and a child
# inherits that mask (the benchmark then ran on one core beside SDPA on all of them).
PROCESS_CPUS = os.sched_getaffinity(0)


def run_benchmark(command, env):
    """The standard output of longattn's benchmark program, run on every CPU of PROCESS_CPUS."""
    return subprocess.run(command, env=env, check=True, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, PROCESS_CPUS)).stdout


def seconds_per_step(step, min_time=0.5):
    """Runs step() once to warm up, then repeatedly for at least min_time seconds; the mean time."""
    step()
    runs, start = 0, time.perf_counter()
    while True:
        step()
        runs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / runs
