"""Test-wide settings, also inherited by nbval's kernels: the `ci` profile, no progress bars,
and a build folder of the tests' own, so that running the chapters under nbval never
overwrites the claims ledgers of a book built with `make book`; its result cache
(``_build/tests/cache``) is the one the book build test and the Binder test use too. At the
end, the time each part of the suite took."""

import os
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

import nbval.kernel
import pytest
from traitlets import default

from toycore.paths import REPO_ROOT

# What a caller may have exported for a build (a cache, a cluster, a device, a precision) would
# change what the suite checks: the tests run without it, and a test that needs one sets it.
# The profile, Chromium and Binder's settings stay the caller's to give.
KEPT = ("TOYCORE_PROFILE", "TOYCORE_CHROMIUM", "TOYCORE_BINDER_")
for name in [name for name in os.environ if name.startswith("TOYCORE_")]:
    if not name.startswith(KEPT):
        del os.environ[name]
os.environ.setdefault("TOYCORE_PROFILE", "ci")
os.environ["TOYCORE_PROGRESS"] = "0"
os.environ["TOYCORE_BUILD_DIR"] = str(REPO_ROOT / "_build" / "tests")


class UnixSocketKernelManager(nbval.kernel.KernelManager):
    """nbval's kernels talk over Unix sockets, as the book build's do (execute_chapter): a TCP
    port the manager picks can be taken by another process before the kernel binds it, and the
    kernel then dies at its start. The sockets' files are removed when the kernel shuts down."""

    @default("transport")
    def _default_transport(self):
        return "ipc"

    @default("ip")
    def _default_ip(self):
        # short: a socket's path has ~100 bytes
        return str(Path(tempfile.gettempdir()) / f"nbval-{uuid.uuid4().hex[:12]}")


nbval.kernel.KernelManager = UnixSocketKernelManager

BOOK_BUILD = "the book built in ci (every chapter computed, once)"
PHASES = {
    "test_binder": "Binder: its environment, postBuild, Run All in JupyterLab",
    "test_book_build": "the built book's pages and the build's failures",
    "test_browser": "the pages in Chromium",
    "test_in_page": "the in-page widgets against toycore, in Chromium",
    "test_install": "the wheel installed into a fresh venv",
    "test_paper_run": "the budgeted paper run, in ci",
}
HEAVY = {"test_binder", "test_install", "test_browser", "test_in_page", "test_paper_run"}
seconds = defaultdict(float)


# The order files go out to the test processes (see the Makefile): the longest first, so that
# the two processes finish together instead of one running a long file alone at the end. Binder
# and the book build (minutes each, side by side), the pages in Chromium, the chapters under
# nbval (the last chapters are the longest), the wheel's fresh venv, the budgeted paper run;
# then the rest as collected.
LONGEST_FIRST = [
    "test_binder",
    "test_book_build",
    "test_browser",
    "chapters",
    "test_install",
    "test_paper_run",
]


def running_order(items):
    paths = [Path(str(item.path)) for item in items]
    chapters = sorted({path.stem for path in paths if path.suffix == ".ipynb"})
    order = {}
    for name in LONGEST_FIRST:
        for stem in reversed(chapters) if name == "chapters" else [name]:
            order[stem] = len(order)
    return lambda item: order.get(Path(str(item.path)).stem, len(order))


def pytest_collection_modifyitems(items):
    """Mark `book` what executes chapters, builds the book or installs an environment:
    `make check` leaves it out. Then put the files in running order (a stable sort: each
    file's tests keep theirs)."""
    items.sort(key=running_order(items))
    for item in items:
        path = Path(str(item.path))
        if (
            path.suffix == ".ipynb"
            or path.stem in HEAVY
            or "built" in getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.book)


def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller adds up every worker's reports
    path = report.nodeid.split("::")[0]
    phase = "the chapters under nbval" if path.endswith(".ipynb") else "unit tests"
    built = dict(report.user_properties).get("book_build_s", 0.0)
    if built:
        seconds[BOOK_BUILD] += built
    seconds[PHASES.get(Path(path).stem, phase)] += report.duration - built


def pytest_terminal_summary(terminalreporter):
    if not seconds:
        return
    terminalreporter.section("time per phase")
    for phase, total in sorted(seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{total:6.0f} s  {phase}")
    terminalreporter.write_line(
        "(time in each test process; with pytest -n 2 two run side by side, and a test that "
        "waits for the book build counts its wait)"
    )
