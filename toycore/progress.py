"""Progress bars for live kernels only.

The book build and the tests set ``TOYCORE_PROGRESS=0`` so that executed notebooks carry no
progress-bar widgets or carriage-return clutter; a reader's live kernel shows them.
"""

import os

from tqdm.auto import tqdm


def progress_enabled():
    return os.environ.get("TOYCORE_PROGRESS", "1") not in ("0", "false", "no")


def progress_bar(total, desc):
    """A tqdm bar in live kernels; a silent stand-in with the same ``update`` method otherwise."""
    return tqdm(total=total, desc=desc, disable=not progress_enabled(), leave=False)
