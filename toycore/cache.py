"""Content-addressed caching of expensive results, so a rebuild with nothing changed trains nothing.

``@cached`` stores a function's results on disk, keyed by its arguments (``joblib.hash``) in a
folder (``cache_key``) named by what else decides the numbers:

- a hash of the code they depend on: the shared computing modules (``SHARED``: data, models,
  training loop, ...) plus the chapter modules (``theory/``, ``experiments/``) that the
  function's module uses, directly or through other chapter modules. So changing one chapter's
  experiments or theory retrains that chapter and any chapter that imports from it, and a change
  to a shared module retrains everything. Modules that do not change what a computation returns
  (``OUTSIDE_KEY``: plots, widgets, claims, the book build, ...) are left out: restyling a figure
  retrains nothing. The hash is of the source **as this process imported it**, read when the
  package is imported; if a file changes on disk afterwards, this process refuses to use the
  cache until it is restarted, since it could no longer say which code computed a result;
- the device type (``cpu``, ``cuda``), since a GPU's numbers differ from the CPU's in the last bits;
- the versions of torch, numpy and scipy, so that an upgrade is not served the old one's results.

Each result is one file that starts with the sha256 of the rest; a result whose bytes do not
match (altered, truncated) is computed again, with one line on the process's standard error
(in a Jupyter kernel: the build's log, never the page). A lock file per result makes processes
that share the cache compute each result once: the second waits and then loads it.

``$TOYCORE_CACHE`` moves the cache (default ``<build>/cache``); it may be a shared filesystem.
``python -m toycore.cache --prune`` (``make clean-cache``) removes the folders that no current
code, device type and library versions can use.
"""

import argparse
import contextlib
import fcntl
import functools
import hashlib
import importlib
import inspect
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

import joblib
import numpy
import scipy
import torch

from . import devices
from .paths import build_dir

PACKAGE = Path(__file__).resolve().parent
# The modules whose code decides what every computation returns.
SHARED = {
    "__init__.py",
    "cache.py",
    "checks.py",
    "data.py",
    "models.py",
    "noise.py",
    "paths.py",
    "profiles.py",
    "seeding.py",
    "train.py",
}
# Modules that do not change what a computation returns, so they stay out of the cache key.
OUTSIDE_KEY = {
    "plots",
    "widgets.py",
    "claims.py",
    "sizes.py",
    "book.py",
    "offline.py",
    "progress.py",
    "devices.py",
    "shards.py",
    "records.py",
}
CHAPTER_PACKAGES = ("theory", "experiments")
CHAPTER_PREFIXES = tuple(f"toycore.{package}." for package in CHAPTER_PACKAGES)


def _module_files():
    """The package's modules that the key may cover, relative to the package: the shared ones
    and every chapter module. Nothing else in the folder counts (a stray script, an editor's
    lock link such as ``.#linear.py``)."""
    chapter = [
        Path(package) / path.name
        for package in CHAPTER_PACKAGES
        for path in (PACKAGE / package).glob("*.py")
        if path.stem.isidentifier() and path.is_file()
    ]
    return sorted([Path(name) for name in SHARED] + chapter)


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The source this process runs: every module the key may cover, read as the package is
# imported (``toycore/__init__.py`` imports this module first).
IMPORTED = {relative: _digest(PACKAGE / relative) for relative in _module_files()}


def _chapter_modules(module_name):
    """The chapter modules that ``module_name`` is or uses, following their imports."""
    found, todo = set(), [module_name]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for value in vars(importlib.import_module(name)).values():
            used = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
            if isinstance(used, str) and used.startswith(CHAPTER_PREFIXES):
                todo.append(used)
    return {name for name in found if name.startswith(CHAPTER_PREFIXES)}


def _covered(module_name):
    """The module files that results computed in ``module_name`` depend on (None: all)."""
    if module_name is None:
        return sorted(IMPORTED)
    chapter = {
        Path(*name.split(".")[1:]).with_suffix(".py") for name in _chapter_modules(module_name)
    }
    return sorted(
        path for path in IMPORTED if path.parts[0] not in CHAPTER_PACKAGES or path in chapter
    ) + sorted(chapter - set(IMPORTED))


def code_hash(module_name=None):
    """Hash of the source, as imported, that results computed in ``module_name`` depend on:
    the shared modules and the chapter modules it uses. ``None``: every computing module."""
    digest = hashlib.sha256()
    for relative in _covered(module_name):
        digest.update(str(relative).encode())
        digest.update(IMPORTED.get(relative, "imported after the package").encode())
    return digest.hexdigest()[:16]


def check_source_unchanged(module_name=None):
    """Refuse, before any result is read or stored, when a module that the key of
    ``module_name``'s results covers differs on disk from what this process imported."""
    for relative in _covered(module_name):
        path = PACKAGE / relative
        if IMPORTED.get(relative) != (_digest(path) if path.is_file() else None):
            raise RuntimeError(
                f"toycore/{relative} has changed since this process imported toycore: "
                f"restart it (the kernel, or the build), so that results are computed by, and "
                f"stored under, the code on disk"
            )


def cache_key(module_name=None, device=None):
    """The cache folder's name for results computed in ``module_name`` on ``device`` (default:
    the current one): the code hash, the device type and the torch, numpy and scipy versions."""
    device = devices.current() if device is None else torch.device(device)
    return f"{code_hash(module_name)}-{device.type}-{_versions()}"


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
        / cache_key(func.__module__, device)
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


def _store(path, result):
    """Write atomically: readers see the whole file or none."""
    payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", delete=False) as part:
        try:
            part.write(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            part.close()
            os.replace(part.name, path)
        except BaseException:
            os.unlink(part.name)
            raise


@contextlib.contextmanager
def _locked(path):
    """Hold ``path``'s lock file: one process computes a result, the others wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        with contextlib.suppress(OSError):  # a filesystem without locks: compute, maybe twice
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def call(func, args=(), kwargs=None, root=None, device=None):
    """``func(*args, **kwargs)`` (``func`` undecorated), from the cache under ``root`` (default
    ``cache_root()``) for this code, device type and library versions; computed and stored
    when it is not there or is damaged."""
    kwargs = kwargs or {}
    check_source_unchanged(func.__module__)
    path = result_file(func, args, kwargs, root, device)
    result = _load(path, quiet=True)  # a stored result is read without waiting for a lock
    if result is not MISSING:
        return result
    with _locked(path):
        result = _load(path)  # another process may have computed it while we waited
        if result is MISSING:
            result = func(*args, **kwargs)
            _store(path, result)
    return result


def cached(func):
    """Cache ``func``'s results on disk (see the module's docstring).

    The wrapper keeps the plain function as ``.uncached`` and answers ``.in_cache(*args,
    **kwargs)`` without computing anything."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return call(func, args, kwargs)

    wrapper.uncached = func
    wrapper.in_cache = lambda *args, **kwargs: result_file(func, args, kwargs).exists()
    return wrapper


def prune(root=None):
    """Remove the cache folders under ``root`` that no current code can use (another code
    hash, or other library versions); returns the names removed."""
    root = Path(root) if root is not None else cache_root()
    modules = [None] + [
        f"toycore.experiments.{path.stem}"
        for path in _module_files()
        if path.parts[0] == "experiments" and path.stem != "__init__"
    ]
    current = {
        f"{code_hash(module)}-{device}-{_versions()}"
        for module in modules
        for device in ("cpu", "cuda")
    }
    removed = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.is_dir() and folder.name not in current:
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
