"""Benchmark: a training step with glibc's default allocator settings against toycore's.

    make benchmark     (or: .venv/bin/python benchmarks/allocator.py --help)

Chapter 3's tied step at n = 64, m = 1024, 16 models, one thread: its temporaries are 4 MB
(1,024 pages of 4 KiB) each. toycore sets two glibc malloc options at its import
(``toycore.allocator``) so that a step's freed memory stays with the process; with
``TOYCORE_KEEP_FREED_MEMORY=0`` it leaves glibc's defaults. Each side runs in fresh processes
(the options hold for a whole process, and how glibc's adaptive default settles differs from
one process to the next), alternating; prints each run's page faults and milliseconds a step,
then the medians and their ratio.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

# A step's temporaries are 4 MB each, 1,024 pages: a step that got even one of them back as
# fresh pages faults at least that many times (glibc's defaults: about 2,000 a step in most
# processes). Under a quarter of it means none did. A few dozen stray faults a step can remain
# (in a Dask worker one of two showed 20 a step once in about ten runs, the other 0); they are
# not the temporaries.
TEMPORARY_PAGES = 1024
REUSED_BOUND = TEMPORARY_PAGES // 4  # faults a step below which no temporary was fresh


def one_run(warmup, steps):
    """In this process: time ``steps`` steps after ``warmup`` (the heap grows to what a step
    needs); returns page faults and milliseconds per step."""
    import resource
    import time

    import torch

    from toycore.models import TiedBasisAutoencoder
    from toycore.train import make_optimizer

    # the faults of the thread that trains (Linux), not of the process: in a Dask worker
    # Dask's other threads fault too, the more the slower a loaded machine makes the steps
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    torch.set_num_threads(1)
    model = TiedBasisAutoencoder(64, 1024, range(16), 1e-3)
    optimizer = make_optimizer("adamw", model.parameters(), 1e-3)
    for step in range(warmup + steps):
        if step == warmup:
            faults, start = resource.getrusage(who).ru_minflt, time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model.loss_and_grad()
        optimizer.step()
    return dict(
        faults=(resource.getrusage(who).ru_minflt - faults) / steps,
        ms=(time.perf_counter() - start) / steps * 1e3,
    )


def in_a_fresh_process(keep, warmup, steps):
    """``one_run`` in a new interpreter, with toycore's options (keep) or glibc's defaults."""
    environment = {**os.environ, "TOYCORE_KEEP_FREED_MEMORY": "1" if keep else "0"}
    command = [sys.executable, __file__, "--one-run", f"--warmup={warmup}", f"--steps={steps}"]
    out = subprocess.run(command, capture_output=True, text=True, env=environment, check=True)
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per side")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run:
        print(json.dumps(one_run(args.warmup, args.steps)))
        return
    results = {True: [], False: []}
    print("tied step, n = 64, m = 1024, 16 models, one thread: page faults and ms a step")
    for run in range(args.runs):
        for keep in (False, True):
            result = in_a_fresh_process(keep, args.warmup, args.steps)
            results[keep].append(result)
            side = "toycore's options" if keep else "glibc's defaults "
            print(f"  run {run + 1}, {side}: {result['faults']:7.1f} faults {result['ms']:6.2f} ms")
    medians = {
        keep: {key: statistics.median(r[key] for r in runs) for key in ("faults", "ms")}
        for keep, runs in results.items()
    }
    print(
        f"median: glibc's defaults {medians[False]['ms']:.2f} ms ({medians[False]['faults']:.0f} "
        f"faults), toycore's options {medians[True]['ms']:.2f} ms "
        f"({medians[True]['faults']:.0f} faults): "
        f"{medians[False]['ms'] / medians[True]['ms']:.2f}x"
    )


if __name__ == "__main__":
    main()
