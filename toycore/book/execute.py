"""Executing the chapters: papermill runs each in its own kernel, side by side in worker
processes with their shards on a local Dask cluster; an execution whose inputs have not changed
is reused from the result cache; a failing cell, a dead kernel or Ctrl-C ends the build saying
where."""

import concurrent.futures
import contextlib
import fcntl
import gc
import hashlib
import importlib.metadata
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat
import papermill
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from papermill.exceptions import PapermillExecutionError
from traitlets.config import Config

from .. import devices, records, shards
from ..cache import EXECUTED, PACKAGE, cache_root
from ..claims import ledger_files
from ..paths import build_dir
from ..profiles import resolve_profile
from .config import shown

# The longest a single cell may run, per profile: a stuck or pathologically slow cell fails the
# build naming its chapter instead of silently using up CI's time. `paper` runs on a GPU, unbounded.
CELL_TIMEOUT_S = {"ci": 600, "cpu": 3600, "paper": None}
# Seconds each chapter took in a fresh clone's `make book` on the 2-core CPU, two at a time: a
# build with no timings of its own yet (`<build>/timings.json`) orders its chapters by these,
# longest first, so that short chapters, not a long one alone on one core, end the build.
COLD_SECONDS = {
    "cpu": {
        "05_persian_rug": 589,
        "03_incidental_polysemanticity": 365,
        "04_sparsity_from_noise": 186,
        "02_relu_output_model": 92,
        "01_linear_autoencoders": 51,
    }
}


class BuildError(RuntimeError):
    pass


class BuildInterrupted(RuntimeError):
    """Ctrl-C during a build; the message says where it stopped."""


def cache_reads_file(build, chapter):
    """Where ``chapter``'s kernel, in the build folder ``build``, lists the results it read
    from the cache that earlier runs computed (``cache.earlier_results`` reads it)."""
    return Path(build) / "cache-reads" / f"{chapter}.json"


def execute_chapter(notebook, output, profile, device=None):
    """Run one chapter with papermill; a failing or timed-out cell, or a kernel that dies,
    raises BuildError naming the chapter and the cell, and Ctrl-C BuildInterrupted. The kernel
    lists the results it reads from the cache that earlier runs computed in
    ``cache_reads_file``."""
    timeout = CELL_TIMEOUT_S[resolve_profile(profile)]
    chapter = shown(notebook)
    reads = cache_reads_file(build_dir(), notebook.stem)
    reads.unlink(missing_ok=True)  # an earlier run's list must not pass for this one's
    # The kernel talks over Unix sockets in a folder of its own. Over TCP the manager picks free
    # ports and the kernel binds them a moment later, and a port that another process (a second
    # chapter's kernel, a browser's connection) takes in between kills the kernel at its start
    # ("Kernel died before replying to kernel_info").
    sockets = Path(tempfile.mkdtemp(prefix="tk-"))  # short: a socket's path has ~100 bytes
    try:
        with environment(TOYCORE_CACHE_READS=str(reads), TOYCORE_RUN_STARTED=repr(time.time())):
            papermill.execute_notebook(
                str(notebook),
                str(output),
                parameters={"profile": profile, "device": device},
                kernel_name="python3",
                cwd=str(notebook.parent),
                progress_bar=False,
                execution_timeout=timeout,
                # Killed when done: a kernel asked to shut down while its
                # cell runs (Ctrl-C) prints a traceback of its own.
                shutdown_kernel="immediate",
                config=Config(KernelManager=dict(transport="ipc", ip=str(sockets / "kernel"))),
            )
    except CellTimeoutError as error:
        raise BuildError(
            f"{chapter}: a cell ran past the {profile} profile's {timeout} s limit.\n{error}"
        ) from None
    except PapermillExecutionError as error:
        executed = nbformat.read(output, as_version=4)
        raise BuildError(
            f"{chapter}: {committed_cell(executed, error.cell_index, error.source)} raised "
            f"{error.ename}: {error.evalue}\nThe executed copy with the traceback is "
            f"{output}"
        ) from None
    except DeadKernelError:
        raise BuildError(
            f"{chapter}: the kernel died during {stopped_cell(output)} (it was "
            f"killed, or ran out of memory)"
        ) from None
    except RuntimeError as error:  # jupyter_client's, from its wait for the kernel
        if str(error).startswith("Kernel died before replying"):
            raise BuildError(
                f"{chapter}: the kernel died as it started, before running any cell (its own "
                f"error, if it printed one, is in the build's standard error above)"
            ) from None
        if str(error).startswith("Kernel didn't respond"):
            raise BuildError(
                f"{chapter}: the kernel did not answer as it started: {error}"
            ) from None
        raise
    except KeyboardInterrupt as interrupt:
        _kill_kernels()
        with warnings.catch_warnings():  # nbclient's kernel cleanup, cut short, is moot now
            warnings.simplefilter("ignore", RuntimeWarning)
            interrupt.__traceback__ = None
            gc.collect()
        raise BuildInterrupted(
            f"interrupted during {chapter}, {stopped_cell(output)}; finished results are kept"
        ) from None
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    hide_injected_parameters(output)


# What a chapter's execution reads besides its notebook and toycore's files: the libraries that
# compute it, draw it and write it down.
EXECUTION_STACK = (
    "torch",
    "numpy",
    "scipy",
    "matplotlib",
    "pillow",
    "ipywidgets",
    "ipython",
    "ipykernel",
    "jaxtyping",
    "joblib",
    "tqdm",
    "papermill",
    "nbformat",
    "nbclient",
)


def execution_key(notebook, profile, device, package=PACKAGE):
    """A hash of everything executing ``notebook`` reads: the notebook, every file of toycore
    (``package``: its code, sizes and the in-page script), the paper records the pages quote,
    the profile, the device type, Python's version and those of EXECUTION_STACK."""
    digest = hashlib.sha256(f"{profile} {devices.resolve(device).type} {sys.version}".encode())
    files = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path, name in [
        (notebook, notebook.name),
        *((path, str(path.relative_to(package))) for path in files),
        *((path, f"records/{path.name}") for path in sorted(records.FOLDER.glob("*.json"))),
    ]:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for name in EXECUTION_STACK:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{name}=={version}\0".encode())
    return digest.hexdigest()[:16]


def run_chapter(notebook, output, profile, device, recorded=False):
    """Execute one chapter into ``output``, or reuse the copy that an execution with the same
    ``execution_key`` kept in the result cache (``<cache>/executed/``) with the ledgers it saved:
    a rebuild with nothing changed executes nothing. A build that finds the chapter being
    executed by another waits for it, as for a result. A build that records the run
    (``recorded``: the paper profile's) always executes. One copy is kept per chapter, profile
    and device type: a new one replaces the copy that older inputs kept. Returns the seconds
    the execution took, None when reused."""
    profile = resolve_profile(profile)
    if recorded:
        start = time.perf_counter()
        execute_chapter(notebook, output, profile, device)
        return time.perf_counter() - start
    kind = f"{notebook.stem}-{profile}-{devices.resolve(device).type}"
    kept = cache_root() / EXECUTED / f"{kind}-{execution_key(notebook, profile, device)}"
    # the kept copies' names for the chapter's ledger files (the kernel saves them)
    ledgers = dict(zip(("claims.json", "corrections.json"), ledger_files(notebook.stem)))
    kept.parent.mkdir(parents=True, exist_ok=True)
    with open(kept.with_name(kept.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (kept / "executed.ipynb").exists():
            shutil.copy2(kept / "executed.ipynb", output)
            for name, path in ledgers.items():
                if (kept / name).exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(kept / name, path)
                else:
                    path.unlink(missing_ok=True)
            return None
        start = time.perf_counter()
        execute_chapter(notebook, output, profile, device)
        seconds = time.perf_counter() - start
        # kept whole or not at all: written aside, then renamed into place
        part = Path(tempfile.mkdtemp(dir=kept.parent, prefix=".part-"))
        shutil.copy2(output, part / "executed.ipynb")
        for name, path in ledgers.items():
            if path.exists():
                shutil.copy2(path, part / name)
        shutil.rmtree(kept, ignore_errors=True)  # a damaged copy, without its notebook
        try:
            os.rename(part, kept)
        except OSError:  # another build kept its copy first (one waiting on an unlinked lock)
            shutil.rmtree(part, ignore_errors=True)
    _forget_older_executions(kept, kind)
    return seconds


def _forget_older_executions(kept, kind):
    """Remove the copies of ``kind`` (chapter, profile, device type) that older inputs kept,
    except one a build is reading now."""
    for lock_file in kept.parent.glob(f"{kind}-*.lock"):
        older = lock_file.with_suffix("")
        if older == kept:
            continue
        with open(lock_file, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(older, ignore_errors=True)
            lock_file.unlink(missing_ok=True)


def hide_injected_parameters(output):
    """Keep papermill's cell of injected parameters out of the page (Jupyter Book's remove-cell
    tag): the chapter's own parameters cell, just above it, says what may be set."""
    executed = nbformat.read(output, as_version=4)
    for cell in executed.cells:
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
    nbformat.write(executed, output)


def _kill_kernels():
    """Kill this process's Jupyter kernels: Ctrl-C cuts papermill short before it shuts its
    kernel down, and the kernel would go on running its cell until it noticed us gone."""
    for process in Path("/proc").glob("[0-9]*"):  # Linux; elsewhere the kernel ends by itself
        try:
            parent = int((process / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid() and b"ipykernel" in (process / "cmdline").read_bytes():
                os.kill(int(process.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def committed_cell(executed, index, source):
    """Cell ``index`` (with ``source``) of papermill's executed copy, named as in the committed
    notebook: papermill inserts a cell of injected parameters, which that notebook lacks."""
    injected = [
        i
        for i, cell in enumerate(executed.cells)
        if "injected-parameters" in cell.metadata.get("tags", [])
    ]
    number = index - (1 if injected and injected[0] < index else 0)
    first_line = source.strip().splitlines()[0] if source.strip() else ""
    return f"cell {number} (counting from 0, starting `{first_line}`)"


def stopped_cell(output):
    """The cell a chapter's execution stopped in, without an error of its own (a dead kernel,
    Ctrl-C): the last cell papermill started in the executed copy ``output``. papermill then
    marks every cell completed; the copy is corrected to say which failed and which never ran."""
    for _ in range(20):  # a worker may still be writing it: wait up to 2 s for a whole file
        try:
            executed = nbformat.read(output, as_version=4)
            break
        except (OSError, ValueError):
            time.sleep(0.1)
    else:
        return "its start"
    started = [
        i
        for i, cell in enumerate(executed.cells)
        if cell.metadata.get("papermill", {}).get("start_time")
    ]
    if not started:
        return "its start"
    stopped = started[-1]
    for index, cell in enumerate(executed.cells[stopped:], start=stopped):
        if "papermill" in cell.metadata:
            cell.metadata.papermill["status"] = "failed" if index == stopped else "pending"
    partial = output.with_name(output.name + ".partial")  # whole or not at all: others read it
    nbformat.write(executed, partial)
    os.replace(partial, output)
    return committed_cell(executed, stopped, executed.cells[stopped].source)


@contextlib.contextmanager
def environment(**variables):
    """Set environment variables for the duration of a block (papermill's kernels inherit them)."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check_jobs(jobs, device):
    """How many processes compute: ``jobs``, by default one per core on the CPU and one on a
    GPU (processes would take turns on it; one kernel runs each batched shard there in turn)."""
    if jobs is None:
        jobs = 1 if devices.resolve(device).type == "cuda" else (os.cpu_count() or 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1; got {jobs!r}")
    return jobs


@contextlib.contextmanager
def shard_cluster(jobs, threads, log):
    """A local Dask cluster of ``jobs`` workers for every chapter's shards, while the chapters
    run: the longest chapter's shards then spread over the cores that the shorter chapters
    leave free, instead of queueing in its own kernel. Yields its address, or None when the
    user's ``$TOYCORE_SCHEDULER`` names a cluster already (the kernels use that one)."""
    if shards.scheduler():
        yield None
        return
    with contextlib.ExitStack() as stack:
        with _interrupts_deferred():  # the workers inherit it
            cluster = stack.enter_context(shards.local_cluster(jobs, threads))
            stack.callback(_kill_shard_workers, cluster)  # before the cluster closes
        log(f"  shards go to a local Dask cluster of {jobs} workers ({cluster.scheduler_address})")
        yield cluster.scheduler_address


def _kill_shard_workers(cluster):
    """When the chapters are done, or after Ctrl-C: kill the shard workers at once, with Dask's
    warnings about their ends kept out of the log. Closing the cluster would wait for them: for
    a shard in flight after Ctrl-C, lost either way, each worker logging its cancelled task; and
    on a busy machine even idle workers outlast Dask's 4 s and are killed with a warning. Each
    nanny is told first that its worker's end is wanted: it would start a new one, which then
    logged its lost scheduler to the build's stderr."""
    logging.getLogger("distributed").setLevel(logging.ERROR)
    for nanny in cluster.workers.values():
        nanny.close_gracefully(reason="the build ended")
        with contextlib.suppress(OSError, TypeError):
            os.kill(nanny.pid, signal.SIGKILL)


@contextlib.contextmanager
def _interrupts_deferred():
    """Ctrl-C reaches the whole process group. Processes started in this block inherit SIGINT
    blocked, so that the main process alone answers it and a build ends in one line, not a
    traceback each; a Ctrl-C that arrives meanwhile waits, and the main process answers it as
    the block ends (ignoring SIGINT instead would lose it: the build would go on)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _worker_signals():
    """A chapter worker's initializer: Ctrl-C is the main process's to answer, and SIGTERM, with
    which the main process stops it, interrupts its chapter as Ctrl-C would in one process:
    papermill shuts the kernel down and the executed copy says where it stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked since its start
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def _stop_workers(pool):
    """Interrupt a process pool's chapters now (shutting it down would wait for them); each
    worker's chapter ends in BuildInterrupted, which its future reports."""
    workers = list(pool._processes.values())  # the pool has no public way to do this
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    pool.shutdown(wait=True)


def _execute_in_worker(notebook, output, profile, device, variables, recorded):
    """A worker process's chapter: its environment (the kernel inherits it), then
    ``run_chapter``."""
    os.environ.update(variables)
    return run_chapter(notebook, output, profile, device, recorded)


def chapter_order(notebooks, profile, known):
    """The order a build starts ``notebooks`` in: longest first by ``known`` ({stem: seconds},
    this build's timings), else by ``COLD_SECONDS``; a chapter in neither first of all, and
    among those, later chapters first (the book goes from small models to large ones)."""
    expected = {**COLD_SECONDS.get(profile, {}), **known}
    return sorted(reversed(notebooks), key=lambda nb: -expected.get(nb.stem, float("inf")))


def execute_all(notebooks, source, profile, device, jobs, variables, log, on_done, recorded=False):
    """Execute the chapters, ``jobs`` at a time (and with ``jobs`` > 1, every shard on a local
    cluster of ``jobs`` workers, even for one chapter), longest first by ``<build>/timings.json``
    (``chapter_order``).
    ``on_done(notebook, seconds)`` runs as each finishes (seconds None: its kept execution was
    reused, see ``run_chapter``; never when ``recorded``). After a failure, the chapters still
    running finish (what they compute is cached), the others do not start, and the first
    failure (a failed cell, a dead kernel, a record refused) is raised."""
    timings_file = Path(variables["TOYCORE_BUILD_DIR"]) / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    known = timings.get(profile, {})
    order = chapter_order(notebooks, profile, known)

    def done(notebook, seconds):
        if seconds is not None:
            known[notebook.stem] = round(seconds, 1)
            timings_file.write_text(json.dumps({**timings, profile: known}, indent=1))
        on_done(notebook, seconds)

    if jobs == 1:
        with environment(**variables):
            for notebook in order:
                log(f"executing {shown(notebook)} (profile {profile}, {device}) ...")
                seconds = run_chapter(notebook, source / notebook.name, profile, device, recorded)
                done(notebook, seconds)
        return
    # Shard workers split the cores; so do the chapters' kernels, which wait while shards run:
    # a chapter executing alone computes its own cells on every core.
    threads = max(1, (os.cpu_count() or 1) // jobs)
    at_once = min(jobs, len(order))
    kernel_threads = max(1, (os.cpu_count() or 1) // at_once)
    variables = {**variables, "OMP_NUM_THREADS": str(kernel_threads)}
    log(
        f"executing {len(order)} chapter(s) (profile {profile}, {device}), {at_once} at a time, "
        f"torch on {kernel_threads} thread(s) in each chapter and {threads} in each of {jobs} "
        "shard workers ..."
    )
    failure = None
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state forked
    # After Ctrl-C stopped the workers, multiprocessing's tracker would warn about semaphores
    # that it then cleans up itself; it inherits this setting if it starts now.
    quiet = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:resource_tracker:UserWarning"])
    )
    with (
        environment(PYTHONWARNINGS=quiet),
        shard_cluster(jobs, threads, log) as address,
        concurrent.futures.ProcessPoolExecutor(
            at_once, mp_context=context, initializer=_worker_signals
        ) as pool,
    ):
        if address:
            variables = {**variables, "TOYCORE_SCHEDULER": address}
        waiting, running = list(order), {}
        try:
            while waiting or running:
                # Hand the pool only what starts now: a queued chapter could not be held back later.
                while waiting and len(running) < at_once and failure is None:
                    notebook = waiting.pop(0)
                    with _interrupts_deferred():  # the pool may start a worker now
                        running[
                            pool.submit(
                                _execute_in_worker,
                                notebook,
                                source / notebook.name,
                                profile,
                                device,
                                variables,
                                recorded,
                            )
                        ] = notebook
                if not running:
                    break
                ended, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in ended:
                    notebook = running.pop(future)
                    try:
                        done(notebook, future.result())
                    except concurrent.futures.process.BrokenProcessPool:
                        # A worker was killed (SIGKILL, out of memory), and the pool ended
                        # every chapter it ran: which one's process died, it does not say.
                        if failure is None:
                            where = ", ".join(
                                f"{shown(stopped)} at {stopped_cell(source / stopped.name)}"
                                for stopped in [notebook, *running.values()]
                            )
                            failure = BuildError(
                                f"a chapter's process died (killed, or out of "
                                f"memory) while running {where}"
                            )
                    except Exception as error:
                        if failure is None:
                            failure = error
                            log(
                                f"{shown(notebook)} failed; the chapters still "
                                f"running finish, so that their results are cached"
                            )
        except KeyboardInterrupt:
            _stop_workers(pool)
            where = "; ".join(
                f"{shown(notebook)}, {stopped_cell(source / notebook.name)}"
                for notebook in running.values()
            )
            raise BuildInterrupted(
                f"interrupted during {where or 'the build'}; finished results are kept"
            ) from None
    if failure is not None:
        raise failure
