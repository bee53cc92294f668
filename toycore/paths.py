"""Where the book is, and where it writes: ``$TOYCORE_BUILD_DIR`` or ``_build`` in the book.

The book's folder (``REPO_ROOT``, the one that holds ``_toc.yml``) is the folder that holds
toycore when toycore runs from a clone of the book (or is installed from one in editable mode);
else, for a toycore installed from a wheel (``pip install .[book]``), the current folder or the
nearest folder above it that holds ``_toc.yml``, as when the build runs from the clone and a
chapter's kernel from its ``chapters/``; else the current folder, where the book's commands say
what is missing.
"""

import os
from pathlib import Path

TOC = "_toc.yml"


def find_root(package_parent=Path(__file__).resolve().parent.parent, here=None):
    """The book's folder, as the module's docstring says."""
    if (package_parent / TOC).is_file():
        return package_parent
    here = Path(here or Path.cwd()).resolve()
    return next((folder for folder in (here, *here.parents) if (folder / TOC).is_file()), here)


REPO_ROOT = find_root()


def build_dir():
    return Path(os.environ.get("TOYCORE_BUILD_DIR") or REPO_ROOT / "_build")
