"""Content-addressed caching of expensive results, so a rebuild with nothing changed trains nothing.

``@cached`` stores a function's results on disk, keyed by its arguments (``joblib.hash``) in a
folder (``cache_key``) named by what else decides the numbers:

- the hash of exactly the code they depend on (``toycore.dependencies``): the function, and the
  functions, classes and constants of toycore it uses, followed transitively, normalised so that
  comments, docstrings and formatting do not count. Plots, widgets, the build and the cache
  itself are left out: restyling a figure or mending a docstring retrains nothing, and an edit
  to one chapter's training re-keys only the results that run it. The key is of the source **as
  this process imported it**; if that code changes on disk afterwards (an edit that changes the
  key, not a comment), this process refuses to use the cache for the results it affects until it
  is restarted, since it could no longer say which code computed them. ``@cached(version="2")``
  adds a stamp for what no name in the code reveals (a data file it reads, say);
- the device type (``cpu``, ``cuda``), since a GPU's numbers differ from the CPU's in the last bits;
- the versions of torch, numpy and scipy, so that an upgrade is not served the old one's results.

A cached function's arguments are plain values (numbers, strings, arrays, and lists, tuples and
dicts of them): an instance of a toycore class is refused, since its methods' code would be in
no key.

Each result is one file that starts with the sha256 of the rest; a result whose bytes do not
match (altered, truncated) is computed again, with one line on the process's standard error
(in a Jupyter kernel: the build's log, never the page). Beside the result, a small file keeps
how long computing it took and when it finished, and the same for every cached result it was
made of (``Timing``), so that a run which reads results from the cache can say how long computing
them took (``$TOYCORE_CACHE_READS``, ``earlier_results``): a paper record made again from the
cache in seconds then says that its values took an earlier run hours. A lock file per result
makes processes that share the cache compute each result once: the second waits and then loads
it.

``$TOYCORE_CACHE`` moves the cache (default ``<build>/cache``); it may be a shared filesystem.
``python -m toycore.cache --prune`` (``make clean-cache``) removes the folders that no current
code, device type and library versions can use.
"""

import argparse
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib
import inspect
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

import joblib
import numpy
import scipy
import torch

from . import devices
from .dependencies import PACKAGE_NAME, Code, changes_in
from .paths import build_dir
from .progress import elapsed

PACKAGE = Path(__file__).resolve().parent
# The folder under the cache root where the book keeps executed chapters (toycore.book).
EXECUTED = "executed"


def _module_files(package=PACKAGE):
    """The package's modules, by dotted name: every .py file in it, none elsewhere (a stray
    editor's lock link such as ``.#linear.py`` is not a module)."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).with_suffix("")
        if "__pycache__" in relative.parts or not all(p.isidentifier() for p in relative.parts):
            continue
        if path.is_file():
            files[".".join((PACKAGE_NAME, *relative.parts))] = path
    return files


def _stats(files):
    stats = {}
    for name, path in files.items():
        with contextlib.suppress(OSError):
            info = path.stat()
            stats[name] = (info.st_mtime_ns, info.st_size)
    return stats


# The source this process runs, read as the package is imported (``toycore/__init__.py``
# imports this module first).
_FILES = _module_files()
IMPORTED = {name: path.read_text() for name, path in _FILES.items()}
_IMPORTED_STATS = _stats(_FILES)
_CODES = {}  # Code read from a set of texts, by the texts' hash


def _code(texts):
    digest = hashlib.sha256()
    for name in sorted(texts):
        digest.update(f"{name}\0{texts[name]}\0".encode())
    key = digest.hexdigest()
    if key not in _CODES:
        _CODES[key] = Code(texts)
    return _CODES[key]


def imported_code():
    """toycore's code as this process imported it (``toycore.dependencies.Code``)."""
    return _code(IMPORTED)


def _qualified(func):
    return f"{func.__module__}.{func.__qualname__}"


def _outside_source(func, on_disk=False):
    """The source of the module of a function outside toycore (a test's, a script's): as first
    read by this process, or as on disk now; None where it has none (a builtin)."""
    module = sys.modules.get(func.__module__)
    if module is None or func.__module__ == "builtins":
        return None
    if not on_disk and func.__module__ in _OUTSIDE:
        return _OUTSIDE[func.__module__]
    try:
        text = Path(inspect.getsourcefile(module)).read_text()
    except (TypeError, OSError):
        return None
    _OUTSIDE.setdefault(func.__module__, text)
    return text


_OUTSIDE = {}  # {module: its source as first read}


def _texts_for(func, on_disk=False):
    """toycore's source (as imported, or on disk now), with that of ``func``'s own module when
    it lies outside toycore."""
    if on_disk:
        files = _module_files()
        if _stats(files) == _IMPORTED_STATS:
            texts = IMPORTED
        else:
            texts = {}
            for name, path in files.items():
                with contextlib.suppress(OSError):
                    texts[name] = path.read_text()
    else:
        texts = IMPORTED
    if func.__module__.split(".")[0] != PACKAGE_NAME:
        outside = _outside_source(func, on_disk)
        if outside is not None:
            texts = {**texts, func.__module__: outside}
    return texts


def _key_in(texts, func):
    version = getattr(func, "cache_version", None)
    code = _code(texts)
    name = _qualified(func)
    if name not in code.units:  # no source to read (a builtin): its name stands for its code
        return hashlib.sha256(f"{name} {version}".encode()).hexdigest()[:16]
    key = code.function_key(name)
    return key if version is None else hashlib.sha256(f"{key} {version}".encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def code_key(func):
    """The hash of exactly the code ``func``'s results depend on, as this process imported it
    (see the module's docstring), with the stamp ``@cached(version=...)`` gave it."""
    return _key_in(_texts_for(func), func)


def check_source_unchanged(func):
    """Refuse, before any result is read or stored, when the code ``func``'s results depend on
    differs on disk from what this process imported (a comment or docstring edit does not)."""
    on_disk = _texts_for(func, on_disk=True)
    if on_disk is IMPORTED or _key_in(on_disk, func) == _key_in(_texts_for(func), func):
        return
    name = _qualified(func)
    changed = changes_in(_code(_texts_for(func)), _code(on_disk), [name])
    raise RuntimeError(
        f"the code that {name} runs has changed since this process imported toycore "
        f"({', '.join(changed)}): restart it (the kernel, or the build), so that results are "
        f"computed by, and stored under, the code on disk"
    )


def cache_key(func, device=None):
    """The cache folder's name for ``func``'s results (the plain function) on ``device``
    (default: the current one): its code key, the device type (with ``-tf32`` where matrix
    products round to TF32) and the torch, numpy and scipy versions."""
    device = devices.current() if device is None else torch.device(device)
    return f"{code_key(func)}-{_device_kind(device)}-{_versions()}"


def _device_kind(device):
    tf32 = "-tf32" if devices.matmul_precision() == "tf32" else ""
    return f"{device.type}{tf32}"


def _versions():
    return f"torch{torch.__version__}-numpy{numpy.__version__}-scipy{scipy.__version__}"


def cache_root():
    """``$TOYCORE_CACHE``, else ``<build>/cache``."""
    return Path(os.environ.get("TOYCORE_CACHE") or build_dir() / "cache")


def result_file(func, args, kwargs, root=None, device=None):
    """Where ``func(*args, **kwargs)``'s result is stored: ``<root>/<cache_key>/<module>/
    <function>/<hash of the arguments, defaults filled in>.pkl``."""
    call = inspect.signature(func).bind(*args, **kwargs)
    call.apply_defaults()
    root = Path(root) if root is not None else cache_root()
    return (
        root
        / cache_key(func, device)
        / func.__module__
        / func.__qualname__
        / f"{joblib.hash(dict(call.arguments))}.pkl"
    )


def _say(line):
    """One line on the process's own standard error: in a Jupyter kernel the original one (the
    build's or the server's log), since ipykernel forwards what reaches fd 2 into the page."""
    original = getattr(sys.stderr, "_original_stdstream_copy", None)  # ipykernel's, if any
    if isinstance(original, int):
        os.write(original, f"{line}\n".encode())
    else:
        print(line, file=sys.__stderr__ or sys.stderr, flush=True)


MISSING = object()  # what _load returns for no usable result (a result may be None)


def _load(path, quiet=False):
    """The result stored in ``path``, or MISSING when there is none or it is damaged (said,
    unless ``quiet``, in one line on the process's own standard error, which a kernel's page
    never shows)."""
    try:
        stored = path.read_bytes()
    except FileNotFoundError:
        return MISSING
    checksum, _, payload = stored.partition(b"\n")
    if checksum != hashlib.sha256(payload).hexdigest().encode():
        if not quiet:
            _say(
                f"toycore.cache: {path} is damaged (its checksum does not match); computing "
                f"it again"
            )
        return MISSING
    return pickle.loads(payload)


def _write_atomically(path, data):
    """Write ``data`` (bytes) to ``path`` so that readers see the whole file or none, and leave
    no part behind if the write fails."""
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", delete=False) as part:
        try:
            part.write(data)
            part.close()
            os.replace(part.name, path)
        except BaseException:
            os.unlink(part.name)
            raise


def _store(path, result):
    payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    _write_atomically(path, hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


@dataclasses.dataclass(frozen=True)
class Timing:
    """How a stored result was computed, kept beside it (``<result>.json``, so that the result's
    own file reads as before): ``seconds``, how long computing it took, less the time spent in
    other cached calls inside it (None where no time was kept: results stored before times
    were); ``finished``, when it was stored (``time.time()``); ``made_of``, every cached result
    read or computed while computing it, at any depth, as ``{name: (seconds, finished)}``, named
    by their path under the cache's root. So each result's time is counted once, under its own
    name."""

    seconds: float | None
    finished: float
    made_of: dict


def _timing_file(path):
    return path.with_suffix(".json")


def _timing(path):
    """The ``Timing`` kept beside the result in ``path``; for a result stored without one (or
    with a damaged one), no time and the file's own date."""
    try:
        kept = json.loads(_timing_file(path).read_text())
        return Timing(
            kept["seconds"], kept["finished"], {k: tuple(v) for k, v in kept["made_of"].items()}
        )
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return Timing(None, path.stat().st_mtime, {})
        except FileNotFoundError:  # removed since it was read (a prune): its date is unknown
            return Timing(None, time.time(), {})


def _store_timing(path, timing):
    """Written before the result, so that a result never shows without its time (a time without
    its result is never read)."""
    _write_atomically(_timing_file(path), json.dumps(dataclasses.asdict(timing)).encode())


@dataclasses.dataclass(eq=False)  # told apart by identity: two fresh ones are alike
class _Computation:
    """A computation in progress: the cached results it used so far (``Timing.made_of``) and
    the seconds spent in cached calls inside it."""

    used: dict = dataclasses.field(default_factory=dict)
    inner_seconds: float = 0.0


# This process's computations in progress, innermost last; the first is the process's own, whose
# results it reports ($TOYCORE_CACHE_READS).
_IN_PROGRESS = [_Computation()]
_REPORTED = [None]  # the last report written, to write only what changes it


def note_used(used, seconds=0.0):
    """Add ``used`` (``{name: (seconds, finished)}``) to the computation in progress, and
    ``seconds`` to the time it spent in cached calls: results that another process (a shard's
    worker) used or computed for it."""
    _IN_PROGRESS[-1].used.update(used)
    _IN_PROGRESS[-1].inner_seconds += seconds
    if len(_IN_PROGRESS) == 1:
        _report()


@contextlib.contextmanager
def recording():
    """The cached results used inside the block, as ``{name: (seconds, finished)}``, apart
    from the process's own (a shard's worker hands them back to its caller)."""
    computation = _Computation()
    _IN_PROGRESS.append(computation)
    try:
        yield computation.used
    finally:
        _IN_PROGRESS.remove(computation)


def _report():
    """Write, where ``$TOYCORE_CACHE_READS`` names a file, the results this process used that
    were stored before ``$TOYCORE_RUN_STARTED`` (a time.time()): what this run read from the
    cache rather than computed, ``{"results": {name: seconds or null}}``."""
    target, started = (os.environ.get(k) for k in ("TOYCORE_CACHE_READS", "TOYCORE_RUN_STARTED"))
    if not target or not started:
        return
    earlier = {
        name: seconds
        for name, (seconds, finished) in _IN_PROGRESS[0].used.items()
        if finished < float(started)
    }
    if earlier != _REPORTED[0]:
        target = Path(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(target, json.dumps({"results": earlier}).encode())
        _REPORTED[0] = earlier


def earlier_results(report):
    """From a run's ``$TOYCORE_CACHE_READS`` file (``report``; none: the run read no earlier
    result), what it read from the cache that earlier runs computed: ``{"results": count,
    "computed_s": their computing time where known, "unknown": how many of them have no time
    kept}``."""
    report = Path(report)
    seconds = list(json.loads(report.read_text())["results"].values()) if report.exists() else []
    known = [s for s in seconds if s is not None]
    return dict(
        results=len(seconds), computed_s=round(sum(known), 1), unknown=len(seconds) - len(known)
    )


@contextlib.contextmanager
def _locked(path):
    """Hold ``path``'s lock file: one process computes a result, the others wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        with contextlib.suppress(OSError):  # a filesystem without locks: compute, maybe twice
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def check_arguments(func, args, kwargs):
    """Refuse an argument that holds an instance of a toycore class: the code of its methods
    would be in no key."""
    todo = [*args, *kwargs.values()]
    while todo:
        value = todo.pop()
        if isinstance(value, (list, tuple, set, frozenset)):
            todo += list(value)
        elif isinstance(value, dict):
            todo += [*value.keys(), *value.values()]
        elif type(value).__module__.split(".")[0] == PACKAGE_NAME:
            raise TypeError(
                f"{_qualified(func)} is cached, so its arguments must be plain values "
                f"(numbers, strings, arrays, sequences of them); got a "
                f"{type(value).__qualname__}, whose code no cache key covers"
            )


def call(func, args=(), kwargs=None, root=None, device=None):
    """``func(*args, **kwargs)`` (``func`` undecorated), from the cache under ``root`` (default
    ``cache_root()``) for this code, device type and library versions; computed and stored
    when it is not there or is damaged."""
    kwargs = kwargs or {}
    check_arguments(func, args, kwargs)
    check_source_unchanged(func)
    root = Path(root) if root is not None else cache_root()
    path = result_file(func, args, kwargs, root, device)
    began = time.perf_counter()
    result = _load(path, quiet=True)  # a stored result is read without waiting for a lock
    if result is MISSING:
        with _locked(path):
            result = _load(path)  # another process may have computed it while we waited
            if result is MISSING:
                result, timing = _compute(func, args, kwargs)
                _store_timing(path, timing)
                _store(path, result)
    timing = _timing(path)
    # the time spent here, computing or waiting, is not the caller's own
    note_used(
        {str(path.relative_to(root)): (timing.seconds, timing.finished), **timing.made_of},
        seconds=time.perf_counter() - began,
    )
    return result


def _compute(func, args, kwargs):
    """``func(*args, **kwargs)`` and its ``Timing``; in a live kernel, outside any other cached
    computation, a line that says what runs and for how long (its trainings add their bars)."""
    shown = len(_IN_PROGRESS) == 1  # the process's own: no other computation around it
    inside = _Computation()
    _IN_PROGRESS.append(inside)
    began = time.perf_counter()
    try:
        with elapsed(f"computing {func.__name__}") if shown else contextlib.nullcontext():
            result = func(*args, **kwargs)
    finally:
        _IN_PROGRESS.remove(inside)
    took = time.perf_counter() - began
    return result, Timing(max(0.0, took - inside.inner_seconds), time.time(), inside.used)


CACHED = []  # every @cached function this process defined (the plain ones), for prune


def cached(func=None, *, version=None):
    """Cache ``func``'s results on disk (see the module's docstring): ``@cached``, or
    ``@cached(version="2")`` to add a stamp for a dependency that no name in the code reveals.

    The wrapper keeps the plain function as ``.uncached`` and answers ``.in_cache(*args,
    **kwargs)`` without computing anything."""
    if func is None:
        return functools.partial(cached, version=version)
    if version is not None:
        func.cache_version = str(version)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return call(func, args, kwargs)

    wrapper.uncached = func
    wrapper.in_cache = lambda *args, **kwargs: result_file(func, args, kwargs).exists()
    CACHED.append(func)
    return wrapper


def _every_cached_function():
    """Every @cached function of toycore (its experiments modules imported to define them)."""
    for name in _module_files():
        if name.startswith(f"{PACKAGE_NAME}.experiments."):
            importlib.import_module(name)
    return list(CACHED)


def book_key(device=None):
    """One name for the results of the whole book on ``device``: a hash of every cached
    function's key, the device type and the library versions (the published book's workflow
    saves its result cache under it)."""
    device = devices.current() if device is None else torch.device(device)
    keys = sorted(f"{_qualified(func)} {code_key(func)}" for func in _every_cached_function())
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
    return f"{digest}-{_device_kind(device)}-{_versions()}"


def prune(root=None):
    """Remove the cache folders under ``root`` that no current code can use (no cached
    function of toycore has that code key, or other library versions); returns the names
    removed. The book's executed chapters (``executed/``) are the book's to manage."""
    root = Path(root) if root is not None else cache_root()
    current = {
        f"{code_key(func)}-{device}-{_versions()}"
        for func in _every_cached_function()
        for device in ("cpu", "cuda", "cpu-tf32", "cuda-tf32")
    }
    removed = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.is_dir() and folder.name not in current and folder.name != EXECUTED:
            shutil.rmtree(folder)
            removed.append(folder.name)
    return removed


def main(argv=None):
    parser = argparse.ArgumentParser(description="toycore's result cache")
    parser.add_argument(
        "--prune",
        action="store_true",
        required=True,
        help="remove the folders that no current code or library versions use",
    )
    parser.parse_args(argv)
    root = cache_root()
    before = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0
    removed = prune(root)
    after = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0
    print(
        f"{root}: removed {len(removed)} folder(s) that no current code uses; "
        f"{before / 2**20:.0f} MB before, {after / 2**20:.0f} MB now"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
