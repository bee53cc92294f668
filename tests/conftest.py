import fcntl
import os
import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from toycore import book, cache
from toycore.book import execute

# The browser to drive: $TOYCORE_CHROMIUM, else the first Chromium on PATH (never one that
# Playwright downloads).
CHROMIUM = Path(
    os.environ.get("TOYCORE_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
    or "/usr/bin/chromium"
)
# Without the networking flags Chromium itself calls out to Google at start (refused here).
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]
build_seconds = []  # the book build's time, until the test whose setup built it reports it


def run_folder(tmp_path_factory):
    """A folder for this test run that every pytest-xdist worker of the run shares."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The whole book built once per test run in the `ci` profile: (build folder, index.html).
    Its results go to the tests' result cache, which nbval's kernels and the Binder test read,
    so that each chapter is computed once per run. Under pytest-xdist the first worker to need
    the book builds it; another waits for it and reads it."""
    run = run_folder(tmp_path_factory)
    build_dir, done = run / "book", run / "book.done"
    with open(run / "book.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            start = time.perf_counter()
            with execute.environment(TOYCORE_CACHE=str(cache.cache_root())):
                book.build("ci", build_dir, log=lambda message: None)
            build_seconds.append(time.perf_counter() - start)
            done.touch()
    return build_dir, build_dir / "html" / "index.html"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The setup that built the book says so, for the time per phase (the root conftest)."""
    report = (yield).get_result()
    if call.when == "setup" and build_seconds:
        report.user_properties.append(("book_build_s", build_seconds.pop()))


@pytest.fixture(scope="module")
def browser():
    """Chromium, headless, driven by Playwright."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser test needs Chromium, not found at {CHROMIUM}: apt-get install "
            "chromium, or set TOYCORE_CHROMIUM to a Chromium or Chrome executable"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
