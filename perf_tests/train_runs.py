"""longattn-train runs shared by the training scripts."""
import json
import os
import subprocess
import sys
import tempfile


def run_copies(program, ranks, args, script, threads=None, peak_gflops=1, copies=1, extra_env=None):
    """Runs `copies` independent runs of `program` (longattn-train) at once (more than one: every
    core computes, as in a training job that fills its nodes), each on `ranks` MPI ranks of
    `threads` OpenMP threads (default: the cores shared among them) with `args`, quiet, no
    validation, the FMA peak of all ranks' cores given (1 unless the caller knows it; None: the
    trainer measures it: the fastest of three 0.1 s windows), `extra_env` set for every rank; returns their JSON summaries. A
    failed run ends `script` with the command and its output."""
    extra_env = extra_env or {}
    with tempfile.TemporaryDirectory() as tmp:
        threads = threads or max(1, (os.cpu_count() or 1) // ranks)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra_env)
        peak = [] if peak_gflops is None else ["--peak-gflops", str(peak_gflops)]
        exported = [x for name in ["OMP_NUM_THREADS", "OMP_PROC_BIND", *extra_env] for x in ("-x", name)]
        summaries = [os.path.join(tmp, f"summary-{c}.json") for c in range(copies)]
        commands = [[program, "--quiet", "--eval-every", "0", "--json", summary] + peak + args for summary in summaries]
        if ranks > 1:
            commands = [["mpiexec", "-n", str(ranks), "--oversubscribe", "--bind-to", "none"] + exported + c
                        for c in commands]
        running = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for c in commands]
        for command, process in zip(commands, running):
            output = process.communicate()[0]
            if process.returncode != 0:
                sys.exit(f"{script}: {' '.join(command)} failed:\n{output}")
        results = []
        for summary in summaries:
            with open(summary) as f:
                results.append(json.load(f))
        return results


def run_training(program, ranks, args, script, threads=None, peak_gflops=1):
    """One run of run_copies: its JSON summary."""
    return run_copies(program, ranks, args, script, threads, peak_gflops)[0]
