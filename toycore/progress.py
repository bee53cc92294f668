"""Progress bars for live kernels and terminals only.

The book build and the tests set ``TOYCORE_PROGRESS=0`` so that executed notebooks carry no
progress-bar widgets or carriage-return clutter; a reader's live kernel shows them, and so does
a terminal. Output to a file or a pipe (a benchmark's log) gets none: there every redraw would
be a line of its own.
"""

import contextlib
import itertools
import os
import sys
import threading
import time

from tqdm.auto import tqdm

# TOYCORE_PROGRESS_LOG names a file that every bar also writes to, a line when it starts, every
# LOG_EVERY_S seconds while it runs and one when it closes: a budgeted run stopped mid-cell (the
# paper run) still says how far each training had got, and how long each finished one took.
LOG_EVERY_S = 10
FEW_STEPS = 1000  # a bar of so few steps (shards, starts) writes a line at every one
# An elapsed-time line appears once its work has run this long (quicker work shows none), and
# is redrawn this often.
ELAPSED_DELAY_S, ELAPSED_EVERY_S = 2.0, 1.0
_numbers = itertools.count(1)


def progress_enabled():
    if os.environ.get("TOYCORE_PROGRESS", "1") in ("0", "false", "no"):
        return False
    in_kernel = "ipykernel" in sys.modules  # a Jupyter kernel draws a widget, not redraws
    return in_kernel or bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bar(total, desc):
    """A tqdm bar in live kernels and terminals; a silent stand-in with the same ``update``
    method otherwise; either also logged where TOYCORE_PROGRESS_LOG names a file."""
    bar = tqdm(total=total, desc=desc, disable=not progress_enabled(), leave=False)
    log = os.environ.get("TOYCORE_PROGRESS_LOG")
    return _LoggedBar(bar, total, desc, log) if log else bar


@contextlib.contextmanager
def elapsed(desc, delay=ELAPSED_DELAY_S, every=ELAPSED_EVERY_S):
    """For work with no steps to count: in live kernels and terminals, once it has run
    ``delay`` seconds, a line "desc: 00:05" that counts the time every ``every`` seconds until
    the work is done; logged as a bar is where TOYCORE_PROGRESS_LOG names a file (a budgeted
    run stopped mid-cell then says what it was computing); nothing otherwise."""
    shown, log = progress_enabled(), os.environ.get("TOYCORE_PROGRESS_LOG")
    if not (shown or log):
        yield
        return
    bar = tqdm(
        total=None,
        desc=desc,
        bar_format="{desc}: {elapsed}",
        delay=delay,
        leave=False,
        disable=not shown,
    )
    bar = _LoggedBar(bar, None, desc, log) if log else bar
    done = threading.Event()

    def redraw():  # tqdm redraws on updates alone (after its delay): an empty one a tick
        while not done.wait(every):
            bar.update(0)

    clock = threading.Thread(target=redraw, daemon=True)
    clock.start()
    try:
        yield
    finally:
        done.set()
        clock.join()
        bar.close()


class _LoggedBar:
    """``bar``, with lines "#k desc: n of total after t s (running|done)" appended to ``path``
    (k numbers the bars of a process: descriptions repeat); "#k desc: after t s (...)" for a
    bar with no total (``elapsed``)."""

    def __init__(self, bar, total, desc, path):
        self.bar, self.total, self.desc, self.path = bar, total, desc, path
        self.label = f"#{os.getpid()}.{next(_numbers)}"
        self.n, self.start = 0, time.monotonic()
        self._write("running")  # a part stopped before the bar's next line still names it

    def update(self, n=1):
        self.bar.update(n)
        self.n += n
        few = self.total is not None and self.total <= FEW_STEPS
        if few or time.monotonic() - self.written >= LOG_EVERY_S:
            self._write("running")

    def close(self):
        self.bar.close()
        self._write("done")

    def _write(self, state):
        self.written = time.monotonic()
        with open(self.path, "a") as log:
            counted = f"{self.n:,} of {self.total:,} " if self.total is not None else ""
            log.write(
                f"{self.label} {self.desc}: {counted}after "
                f"{self.written - self.start:.1f} s ({state})\n"
            )
