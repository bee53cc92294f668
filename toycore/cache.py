"""Content-addressed caching of expensive results, so a rebuild with nothing changed trains nothing.

``@cached`` wraps a function with joblib.Memory: results are keyed by the function's code and
arguments, and the cache folder is keyed by a hash of every computing module of toycore, so a
change to the data, models, training loop or theory invalidates old results. Presentation modules
(plots, widgets, claims, the book build) are left out of the hash: restyling a figure retrains
nothing. ``$TOYCORE_CACHE`` moves the cache (default ``<build>/cache``).
"""
import functools
import hashlib
import os
from pathlib import Path

from joblib import Memory

from .paths import build_dir

PACKAGE = Path(__file__).resolve().parent
PRESENTATION = {"plots", "widgets.py", "claims.py", "book.py", "progress.py"}


def code_hash():
    """Hash of the source of every toycore module that computes results."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in PRESENTATION:
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
        return _memory(str(root / code_hash())).cache(func)(*args, **kwargs)
    return wrapper
