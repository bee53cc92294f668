"""Progress bars for live kernels and terminals only.

The book build and the tests set ``TOYCORE_PROGRESS=0`` so that executed notebooks carry no
progress-bar widgets or carriage-return clutter; a reader's live kernel shows them, and so does
a terminal. Output to a file or a pipe (a benchmark's log) gets none: there every redraw would
be a line of its own.
"""

import os
import sys

from tqdm.auto import tqdm


def progress_enabled():
    if os.environ.get("TOYCORE_PROGRESS", "1") in ("0", "false", "no"):
        return False
    in_kernel = "ipykernel" in sys.modules  # a Jupyter kernel draws a widget, not redraws
    return in_kernel or bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bar(total, desc):
    """A tqdm bar in live kernels and terminals; a silent stand-in with the same ``update``
    method otherwise."""
    return tqdm(total=total, desc=desc, disable=not progress_enabled(), leave=False)
