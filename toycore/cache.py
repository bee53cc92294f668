"""Content-addressed caching of expensive results, so a rebuild with nothing changed trains nothing.

``@cached`` wraps a function with joblib.Memory: results are keyed by the function's code and
arguments, and the cache folder (``cache_key``) by what else decides the numbers:

- a hash of the code they depend on: toycore's shared computing modules (data, models, training
  loop, ...) plus the chapter modules (``theory/``, ``experiments/``) that the function's module
  uses, directly or through other chapter modules. So changing one chapter's experiments
  retrains that chapter only, and a change to the data, models or training loop retrains
  everything. Modules that do not change what a computation returns (plots, widgets, claims,
  the book build, the choice of device and of shard runner) are left out: restyling a figure
  retrains nothing;
- the device type (``cpu``, ``cuda``), since a GPU's numbers differ from the CPU's in the last bits;
- the versions of torch, numpy and scipy, so that an upgrade is not served the old one's results.

``$TOYCORE_CACHE`` moves the cache (default ``<build>/cache``); it may be a shared filesystem.
"""
import functools
import hashlib
import importlib
import inspect
import os
from pathlib import Path

import numpy
import scipy
import torch
from joblib import Memory

from . import devices
from .paths import build_dir

PACKAGE = Path(__file__).resolve().parent
# Modules that do not change what a computation returns, so they stay out of the cache key.
OUTSIDE_KEY = {"plots", "widgets.py", "claims.py", "book.py", "offline.py", "progress.py",
               "devices.py", "shards.py", "records.py"}


CHAPTER_PACKAGES = ("theory", "experiments")
CHAPTER_PREFIXES = tuple(f"toycore.{package}." for package in CHAPTER_PACKAGES)


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


def code_hash(module_name=None):
    """Hash of the source that results computed in ``module_name`` depend on: the shared
    computing modules and the chapter modules it uses. ``None``: every computing module."""
    if module_name is None:
        chapter_files = {p for package in CHAPTER_PACKAGES for p in (PACKAGE / package).glob("*.py")}
    else:
        chapter_files = {PACKAGE.joinpath(*name.split(".")[1:]).with_suffix(".py")
                         for name in _chapter_modules(module_name)}
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in OUTSIDE_KEY:
            continue
        if relative.parts[0] in CHAPTER_PACKAGES and path not in chapter_files:
            continue
        digest.update(str(relative).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_key(module_name=None, device=None):
    """The cache folder's name for results computed in ``module_name`` on ``device`` (default:
    the current one): the code hash, the device type and the torch, numpy and scipy versions."""
    device = devices.current() if device is None else torch.device(device)
    return (f"{code_hash(module_name)}-{device.type}-torch{torch.__version__}"
            f"-numpy{numpy.__version__}-scipy{scipy.__version__}")


def cache_root():
    """``$TOYCORE_CACHE``, else ``<build>/cache``."""
    return Path(os.environ.get("TOYCORE_CACHE") or build_dir() / "cache")


@functools.lru_cache(maxsize=None)
def _memory(location):
    return Memory(location, verbose=0)


def memorized(func, root=None, device=None):
    """joblib's cached version of ``func`` (an undecorated function) in the folder for this
    code, device type and library versions under ``root`` (default ``cache_root()``)."""
    root = Path(root) if root is not None else cache_root()
    return _memory(str(root / cache_key(func.__module__, device))).cache(func)


def cached(func):
    """Cache ``func``'s results on disk, keyed by the call's arguments and ``cache_key``.

    The wrapper keeps the plain function as ``.uncached`` and answers ``.in_cache(*args,
    **kwargs)`` without computing anything."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return memorized(func)(*args, **kwargs)

    wrapper.uncached = func
    wrapper.in_cache = lambda *args, **kwargs: memorized(func).check_call_in_cache(*args, **kwargs)
    return wrapper
