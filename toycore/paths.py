"""Where the book writes: ``$TOYCORE_BUILD_DIR`` or ``_build`` at the repository root."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def build_dir():
    return Path(os.environ.get("TOYCORE_BUILD_DIR") or REPO_ROOT / "_build")
