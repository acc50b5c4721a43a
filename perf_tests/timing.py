"""Timing shared by the comparison scripts."""
import time


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
