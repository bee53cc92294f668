"""Content-addressed caching of expensive results, so a rebuild with nothing changed trains nothing.

``@cached`` wraps a function with joblib.Memory: results are keyed by the function's code and
arguments, and the cache folder by a hash of the code they depend on: toycore's shared computing
modules (data, models, training loop, ...) plus the chapter modules (``theory/``,
``experiments/``) that the function's module uses, directly or through other chapter modules.
So changing one chapter's experiments retrains that chapter only, and a change to the data,
models or training loop retrains everything. Presentation modules (plots, widgets, claims, the
book build) are left out: restyling a figure retrains nothing. ``$TOYCORE_CACHE`` moves the cache
(default ``<build>/cache``).
"""
import functools
import hashlib
import importlib
import inspect
import os
from pathlib import Path

from joblib import Memory

from .paths import build_dir

PACKAGE = Path(__file__).resolve().parent
PRESENTATION = {"plots", "widgets.py", "claims.py", "book.py", "offline.py", "progress.py"}


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
        if relative.parts[0] in PRESENTATION:
            continue
        if relative.parts[0] in CHAPTER_PACKAGES and path not in chapter_files:
            continue
        digest.update(str(relative).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _memory(location):
    return Memory(location, verbose=0)


def cached(func):
    """Cache ``func``'s results on disk, keyed by toycore's code and the call's arguments."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        root = Path(os.environ.get("TOYCORE_CACHE") or build_dir() / "cache")
        return _memory(str(root / code_hash(func.__module__))).cache(func)(*args, **kwargs)
    return wrapper
