"""Big sweeps as independent shards, run through joblib: in this process, or on a Dask cluster.

A sweep is a list of calls of one ``@cached`` function, each a *shard*: one batched computation
(one hidden size, one block of seeds) cached on its own. ``run(shard, calls)`` loads the shards
already in the cache and computes the others with joblib, on the backend the user picks:

- ``$TOYCORE_SCHEDULER`` unset: in this process, one after another;
- ``$TOYCORE_SCHEDULER=tcp://host:8786``: on that Dask cluster, through joblib's ``dask``
  backend (``dask.distributed``). Each worker computes on the caller's device and writes into
  the caller's cache folder, so ``$TOYCORE_CACHE`` must be a filesystem every worker sees (on
  one machine it is). A worker whose toycore, torch, numpy or scipy differ from the caller's
  refuses the shard instead of caching numbers under the wrong key.

A shard is in the cache the moment it finishes, so an interrupted sweep (Ctrl-C, a killed worker
or kernel) loses only the shards in flight, and running it again computes only those.
"""

import functools
import os
import time
import warnings

from joblib import Parallel, delayed, parallel_config

from . import cache, devices
from .progress import progress_bar


def scheduler():
    """The Dask scheduler's address from ``$TOYCORE_SCHEDULER``, or None for in-process."""
    address = os.environ.get("TOYCORE_SCHEDULER", "").strip()
    if address and "://" not in address:
        raise ValueError(
            f"TOYCORE_SCHEDULER must be a Dask scheduler's address such as "
            f"tcp://host:8786; got {address!r}"
        )
    return address or None


# The start of Dask's warning when a server's scratch folder takes over a second to create.
SCRATCH_WARNING = "Creating scratch directories is taking a surprisingly long time"


def local_cluster(workers, threads=1):
    """A Dask cluster of ``workers`` processes on this machine, one task at a time each, torch
    on ``threads`` threads (a context manager; ``.scheduler_address``). Dask's nanny starts each
    worker with ``MALLOC_TRIM_THRESHOLD_`` set, which on its own made torch's steps 2.2x slower
    there; toycore's allocator options, set when a worker imports it, make it harmless.

    The workers log nothing below CRITICAL: a shard's error reaches its caller as an exception,
    and a worker still alive as the cluster closes under it (after Ctrl-C, on a busy machine)
    logged its lost scheduler into the build's stderr. The setting is in the environment a
    worker starts with (its logging is set up as it imports distributed), restarts included.
    Dask's warning that its scratch folder took over a second to set up, which a busy machine
    alone can cause, is silenced the same way in the workers and in this process (the
    scheduler's and the nannies'). Dask's profiler is off in them."""
    import dask
    from dask.distributed import LocalCluster

    warnings.filterwarnings("ignore", SCRATCH_WARNING, UserWarning)
    # the nanny sets these in this process's environment too, so a second cluster finds it
    filters = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    ignored = f"ignore:{SCRATCH_WARNING}:UserWarning"
    settings = {
        "distributed.nanny.pre-spawn-environ.DASK_LOGGING__DISTRIBUTED": "critical",
        "distributed.nanny.pre-spawn-environ.PYTHONWARNINGS": ",".join(
            filters + [ignored] * (ignored not in filters)
        ),
        # Dask's own profiler samples every worker's stack 100 times a second, for a dashboard
        # no build opens: an idle cluster of two used 4.7% of a core with it, 3.5% without
        "distributed.worker.profile.enabled": False,
    }
    with dask.config.set(settings):
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",  # any free port: no clash, no warning
            # dask's nanny sets all three to 1, and MKL's wins in torch
            env={
                **dict.fromkeys(
                    ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), str(threads)
                ),
                "TOYCORE_PROGRESS": "0",
            },
        )


@functools.lru_cache(maxsize=None)
def _client(address):
    """One Dask client per scheduler for the life of the process (joblib's dask backend finds
    it)."""
    from dask.distributed import Client

    return Client(address, timeout="30s")


def _compute(shard, root, device, key, args, kwargs):
    """Run on whichever process computes the shard: there, with the caller's device and cache.
    ``key``: the caller's cache key, which a Dask worker must share (None: in-process).
    Returns the result and the cached results it used (``cache.recording``), for the caller's
    account of what its run read from the cache."""
    devices.use(device)
    here = key and cache.cache_key(shard.uncached, device)
    if here != key:
        raise RuntimeError(
            f"this worker's toycore code or library versions differ from the "
            f"caller's (cache key {here}, the caller's {key}): install the same "
            f"commit and pins on every worker"
        )
    with cache.recording() as used:
        result = cache.call(shard.uncached, args, kwargs, root, device)
    return result, used


def run(shard, calls, desc="shards"):
    """``[shard(*args, **kwargs) for args, kwargs in calls]``, each shard computed at most once
    ever (see the module's docstring). ``shard`` must be ``@cached``."""
    if not hasattr(shard, "uncached"):
        raise ValueError(f"{getattr(shard, '__name__', shard)!r} is not a @cached function")
    address = scheduler()  # a malformed address fails here, before any work
    calls = [(tuple(args), dict(kwargs)) for args, kwargs in calls]
    results = [None] * len(calls)
    missing = []
    for k, (args, kwargs) in enumerate(calls):
        if shard.in_cache(*args, **kwargs):
            results[k] = shard(*args, **kwargs)  # loads it
        else:
            missing.append(k)
    if not missing:
        return results
    device = devices.current()
    root, key = cache.cache_root(), address and cache.cache_key(shard.uncached, device)
    jobs = [delayed(_compute)(shard, root, str(device), key, *calls[k]) for k in missing]
    bar = progress_bar(len(jobs), f"{desc} ({len(missing)} of {len(calls)} to compute)")
    if address:
        _client(address)
    began = time.perf_counter()
    with parallel_config(backend="dask" if address else "sequential"):
        outputs = Parallel(n_jobs=-1 if address else 1, return_as="generator")(jobs)
        for k, (result, used) in zip(missing, outputs):
            results[k] = result
            cache.note_used(used)
            bar.update(1)
    bar.close()
    # time spent computing cached results, not the caller's own (if it is a cached computation)
    cache.note_used({}, seconds=time.perf_counter() - began)
    return results
