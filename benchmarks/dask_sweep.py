"""Benchmark: a sharded sweep on a local two-worker Dask cluster against the same in-process.

    make benchmark     (or: .venv/bin/python benchmarks/dask_sweep.py --help)

The sweep is chapter 5's grid at one ns (the ``cpu`` profile's largest: ns = 128, four
densities by six ratios), for a fixed number of Adam steps so that both sides do the same work.
It is six shards, one per hidden size. In-process, they run one after another on one torch
thread; on the cluster (``toycore.shards.local_cluster(2)``: ``LocalCluster(n_workers=2,
threads_per_worker=1, processes=True)``, reached through ``TOYCORE_SCHEDULER`` as a remote one
would be), two at a time. Each side starts from an empty cache. Prints both wall times, the
cluster's start-up time, and the ratio; exits with an error if the two sides' numbers differ.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import torch

from toycore import shards
from toycore.experiments.persian_rug import grid_runs


def sweep(cache, args):
    os.environ["TOYCORE_CACHE"] = cache
    start = time.perf_counter()
    (grid,) = grid_runs([args.features], args.densities, args.ratios, [0], steps=args.steps)
    return grid, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.05, 0.2, 0.5])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.4, 0.6, 0.8])
    parser.add_argument("--steps", type=int, default=1500, help="Adam steps per model")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as each worker has
    os.environ.pop("TOYCORE_SCHEDULER", None)
    os.environ["TOYCORE_PROGRESS"] = "0"
    with tempfile.TemporaryDirectory() as here, tempfile.TemporaryDirectory() as there:
        alone, in_process = sweep(here, args)
        start = time.perf_counter()
        with shards.local_cluster(2) as cluster:
            os.environ["TOYCORE_SCHEDULER"] = cluster.scheduler_address
            shards._client(cluster.scheduler_address)
            startup = time.perf_counter() - start
            spread, on_cluster = sweep(there, args)
            shards._client(cluster.scheduler_address).close()
    same = all(np.array_equal(getattr(alone, k), getattr(spread, k)) for k in ("W", "b", "loss"))
    print(
        f"chapter 5's grid at ns = {args.features}: {alone.loss.size} models in "
        f"{len(set(alone.hidden))} shards, {args.steps} Adam steps each, {os.cpu_count()} cores"
    )
    print(f"  in-process, one thread:          {in_process:6.1f} s")
    print(
        f"  local Dask cluster, 2 x 1 thread: {on_cluster:6.1f} s "
        f"(+ {startup:.1f} s to start the cluster)"
    )
    print(
        f"  speed-up {in_process / on_cluster:.2f} ({in_process / (on_cluster + startup):.2f} "
        f"with the start-up); identical numbers: {same}"
    )
    if not same:
        raise SystemExit("the cluster's weights or losses differ from the in-process ones")


if __name__ == "__main__":
    main()
