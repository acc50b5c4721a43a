"""longattn-train runs shared by the training scripts."""
import json
import os
import subprocess
import sys
import tempfile


def run_training(program, ranks, args, script, threads=None, peak_gflops=1, copies=1):
    """Runs `program` (longattn-train) on `ranks` MPI ranks of `threads` OpenMP threads each
    (default: the cores shared among them) with `args`, quiet, no validation, the FMA peak of
    all ranks' cores given (1 unless the caller knows it; None: the trainer measures it, 0.3 s);
    returns its JSON summary. With copies > 1, that many independent runs at once (so that
    every core computes, as in a training job that fills its nodes), and a list of their
    summaries. A failed run ends `script` with the command and its output."""
    with tempfile.TemporaryDirectory() as tmp:
        threads = threads or max(1, (os.cpu_count() or 1) // ranks)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        peak = [] if peak_gflops is None else ["--peak-gflops", str(peak_gflops)]
        summaries, commands = [os.path.join(tmp, f"summary-{c}.json") for c in range(copies)], []
        for summary in summaries:
            command = [program, "--quiet", "--eval-every", "0", "--json", summary] + peak + args
            if ranks > 1:
                command = ["mpiexec", "-n", str(ranks), "--oversubscribe", "--bind-to", "none",
                           "-x", "OMP_NUM_THREADS", "-x", "OMP_PROC_BIND"] + command
            commands.append(command)
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
        return results if copies > 1 else results[0]
