"""Binder, reproduced here: the Binder files' environment, JupyterLab, and a reader in Chromium.

What repo2docker would do for this repository, done by hand: a fresh virtual environment from
``binder/requirements.txt``, ``binder/postBuild`` run in a copy of the repository (it installs
toycore and executes every chapter once, warming the result cache), and ``jupyterlab``, which
repo2docker adds. Then a Jupyter server on 127.0.0.1 and Chromium through Playwright, every
request to any other host refused:

- each chapter opens in JupyterLab (a workspace of its own), "Run All Cells" runs every cell,
  and no cell has an error (two chapters at a time, a kernel each, as two readers would);
- the kernel's peak memory (VmHWM) fits mybinder.org's 2 GiB, and the time Run All took is
  recorded (``<build>/binder/<profile>.json``, and printed);
- a live explorer's control moved and its Run button pressed give a different figure.

The requirements install as Binder would, the PyTorch CPU index line included, where that
index answers within ``INDEX_PROBE_S``; a machine that cannot reach it (these reach only package
registries) installs without the line, from the indexes and wheel folders pip's own
configuration names, which must then hold ``torch==2.13.0+cpu``. pip keeps its own retries, so
one dropped connection does not fail the test. ``TOYCORE_BINDER_OFFLINE=1`` drops the index line
without trying it, for a machine where even that is unwelcome. pip's download cache is left on,
so a second run fetches nothing again. One thing differs from Binder on purpose: the copy's
result cache is the test run's (``TOYCORE_CACHE``), which the book build test and nbval share,
so that Run All reads what the run computed once instead of computing it again, and postBuild,
whose ``toycore.book`` finds there the book build's executed chapters (waiting for those still
running), reuses them instead of executing them again (``toycore.book.execute.run_chapter``).

The profile is the tests' ``ci`` (postBuild honours ``TOYCORE_PROFILE``); for the profile a
Binder reader gets, ``TOYCORE_BINDER_PROFILE=cpu .venv/bin/python -m pytest tests/test_binder.py``.
Two JupyterLab settings that are the test's, not Binder files: notebook windowing is off, so
that every cell's prompt is in the page to be watched, and the app is exposed to the page
(``window.jupyterapp``), so that the test reads the outputs from the notebook the reader has open
instead of saving it and reading the file (a save from the File menu was not always seen).
The kernel's peak memory is its own: no chapter starts processes in a Binder session (Dask
workers start only when a scheduler's address is configured).
"""

import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from toycore import cache
from toycore.book.config import chapters
from toycore.paths import REPO_ROOT

PROFILE = os.environ.get("TOYCORE_BINDER_PROFILE", "ci")
OFFLINE = os.environ.get("TOYCORE_BINDER_OFFLINE") == "1"
# The JupyterLab `make lab` installs (repo2docker's own pick is newer or older; this is today's).
JUPYTERLAB = re.search(r"^JUPYTERLAB := (\S+)$", (REPO_ROOT / "Makefile").read_text(), re.M)[1]
BINDER_MEMORY_LIMIT = 2 * 1024**3  # mybinder.org's memory limit per session, about 2 GiB
CPU_INDEX_LINE = "--extra-index-url https://download.pytorch.org/whl/cpu"
INDEX_PROBE_S = 15  # how long the CPU index may take to answer before it is left out
CHAPTERS = [notebook.name for notebook in chapters()]
RUN_ALL_TIMEOUT_S = {"ci": 600, "cpu": 3600}[PROFILE]
RESULTS = REPO_ROOT / "_build" / "binder" / f"{PROFILE}.json"
# How long the server, a page or a kernel may take to come up: seconds when warm, minutes on a
# cold 2-core machine building the book beside this test. Every wait polls, so ends when ready.
START_TIMEOUT_S = 300


def log(message):
    print(message, file=sys.stderr, flush=True)


def run(command, **kwargs):
    start = time.perf_counter()
    subprocess.run(command, check=True, **kwargs)
    return time.perf_counter() - start


def reader_environment(venv):
    """The environment a Binder session has: no toycore settings from the tests (their build
    folder, no progress bars), the venv first on PATH, and the profile under test; and the test
    run's result cache."""
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("TOYCORE_") and name not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    environ["PATH"] = f"{venv / 'bin'}{os.pathsep}{environ['PATH']}"
    environ["TOYCORE_PROFILE"] = PROFILE
    environ["TOYCORE_CACHE"] = str(cache.cache_root())
    return environ


def answers(url, timeout=INDEX_PROBE_S):
    """Whether ``url`` answers at all (any HTTP status) within ``timeout`` seconds."""
    try:
        urllib.request.urlopen(url, timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, http.client.HTTPException):
        return False
    return True


def copy_repository(target):
    """The repository's tracked and untracked-but-not-ignored files: what Binder would clone."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


@pytest.fixture(scope="module")
def binder(tmp_path_factory):
    """(repository copy, environment) after requirements, postBuild and JupyterLab."""
    root = tmp_path_factory.mktemp("binder")
    repo, venv = root / "repo", root / "venv"
    copy_repository(repo)
    requirements = repo / "binder" / "requirements.txt"
    assert CPU_INDEX_LINE in requirements.read_text().splitlines(), "Binder's torch index moved"
    if OFFLINE or not answers(CPU_INDEX_LINE.split()[-1] + "/"):
        why = "TOYCORE_BINDER_OFFLINE=1" if OFFLINE else f"no answer in {INDEX_PROBE_S} s"
        log(f"binder: installing without {CPU_INDEX_LINE!r} ({why})")
        lines = requirements.read_text().splitlines()
        requirements = root / "requirements.txt"
        requirements.write_text("\n".join(line for line in lines if line != CPU_INDEX_LINE) + "\n")
    environ = reader_environment(venv)
    seconds = run([sys.executable, "-m", "venv", str(venv)])
    seconds += run(
        # not compiled up front (pip's default, half a minute): Python compiles what the
        # kernels import, once (make lets it write bytecode); Binder's image has it either way
        ["pip", "install", "--quiet", "--no-compile", "-r", str(requirements), JUPYTERLAB],
        env=environ,
    )
    log(f"binder: requirements and {JUPYTERLAB} installed in {seconds:.0f} s")
    seconds = run(["bash", "binder/postBuild"], cwd=repo, env=environ)
    log(f"binder: postBuild ({PROFILE} profile) took {seconds:.0f} s")
    assert not (repo / "_build" / "claims").exists(), "postBuild kept the build's ledgers"
    # Every cell in the page (JupyterLab draws only the visible ones by default).
    settings = venv / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "overrides.json").write_text(
        json.dumps({"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}})
    )
    return repo, environ, venv


@pytest.fixture(scope="module")
def server(binder):
    """A Jupyter server for the repository copy on 127.0.0.1: (base URL, token)."""
    repo, environ, venv = binder
    token = "binder-test"
    server_log = repo.parent / "jupyter-server.log"
    # The server picks its own free port (--port=0) and writes it in its runtime folder: a port
    # found free here could be taken by another process before the server, seconds later, binds it.
    # (The server too frees the port it found before listening on it, but for milliseconds.)
    runtime = repo.parent / "jupyter-runtime"
    shutil.rmtree(runtime, ignore_errors=True)
    # A Jupyter config folder of its own, as a fresh Binder session has: JupyterLab keeps its
    # workspaces and user settings there, so none from an earlier run or from the user's own
    # JupyterLab (~/.jupyter) is restored into the pages or overrides the settings above.
    config = repo.parent / "jupyter-config"
    config.mkdir(exist_ok=True)
    # --allow-root: the tests may run as root (CI does); Binder runs as a user, where it is moot.
    process = subprocess.Popen(
        [
            str(venv / "bin" / "jupyter"),
            "lab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            "--port=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={repo}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
        ],
        cwd=repo,
        env={**environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(runtime)},
        stdout=subprocess.DEVNULL,
        stderr=server_log.open("w"),
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            info = next(runtime.glob("jpserver-*.json"))  # written once it has its port
            base = f"http://127.0.0.1:{json.loads(info.read_text())['port']}"
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=10)
            break
        except (OSError, StopIteration, ValueError):
            if process.poll() is None and time.monotonic() < deadline:
                time.sleep(1)
                continue
        process.kill()
        pytest.fail(
            f"the Jupyter server {'exited' if process.poll() else 'did not answer'} within "
            f"{START_TIMEOUT_S} s; it said:\n"
            + "\n".join(server_log.read_text().splitlines()[-10:])
        )
    yield base, token
    process.terminate()
    process.wait(timeout=30)


def api(server, path, method="GET"):
    base, token = server
    request = urllib.request.Request(
        f"{base}/api/{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
    return json.loads(body) if body else None


def only_local(route):
    url = urlsplit(route.request.url)
    if url.scheme in ("data", "blob") or url.hostname == "127.0.0.1":
        route.continue_()
    else:
        route.abort()


def kernel_pid(kernel_id):
    """The process whose command line names the kernel's connection file."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"kernel-{kernel_id}.json" in (proc / "cmdline").read_text():
                return int(proc.name)
        except OSError:
            continue
    raise LookupError(f"no process for kernel {kernel_id}")


def peak_memory(pid):
    """The process's peak resident memory (VmHWM), in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


# The chapter's notebook panel, from JupyterLab's own objects (exposed by the server setting),
# found by its path: the shell's current widget is whatever the page activated last.
PANEL = "[...(window.jupyterapp?.shell.widgets('main') ?? [])].find(w => w.context?.path === path)"
# Its code cells' prompts: "[*]:" queued or running, "[3]:" run, "[ ]:" not run.
PROMPTS = (
    f"[...({PANEL}).node.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent)"
)
KERNEL_IDLE = f"path => ({PANEL})?.sessionContext?.session?.kernel?.status === 'idle'"
# Opened, current (Run All acts on the current widget), loaded, and its kernel started and idle,
# what the status bar shows as "(ipykernel) | Idle": then its session and kernel ids.
OPENED = f"""path => {{
  const shell = window.jupyterapp?.shell, panel = shell && {PANEL};
  if (!panel) return false;
  if (shell.currentWidget !== panel) shell.activateById(panel.id);
  const session = panel.sessionContext?.session;
  return shell.currentWidget === panel && panel.context.isReady &&
    session?.kernel?.status === 'idle' && {{session: session.id, kernel: session.kernel.id}};
}}"""
# What the page has open, for a failure's message.
PAGE_STATE = """() => { const shell = window.jupyterapp?.shell; return shell && {
  current: shell.currentWidget?.context?.path ?? shell.currentWidget?.title.label,
  open: [...shell.widgets('main')].map(w => [w.context?.path ?? w.title.label,
                                             w.sessionContext?.session?.kernel?.status]) }; }"""


def open_chapter(browser, server, name):
    """A page with the chapter open in JupyterLab and its kernel idle: (context, page, its
    session as the server lists it)."""
    base, token = server
    path = f"chapters/{name}"
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    # A cold machine takes longer than Playwright's 30 s for a click or a load.
    context.set_default_timeout(120_000)
    page = context.new_page()
    page.route("**/*", only_local)
    # A workspace of the page's own: /lab/tree/... loads the default workspace, which every page
    # saves its open notebooks into, so a later page would restore the earlier pages' notebooks
    # (starting kernels for them) and might show one of them as its current widget.
    workspace = f"binder-{Path(name).stem}-{os.urandom(4).hex()}"
    try:
        page.goto(f"{base}/lab/workspaces/{workspace}/tree/{path}?token={token}")
        try:
            opened = page.wait_for_function(
                OPENED, arg=path, timeout=START_TIMEOUT_S * 1000, polling=500
            ).json_value()
        except PlaywrightTimeout:
            raise AssertionError(
                f"{name}: not open with an idle kernel after {START_TIMEOUT_S} s; the page has "
                f"{page.evaluate(PAGE_STATE)}"
            ) from None
        return context, page, listed_session(server, path, opened)
    except BaseException:
        context.close()
        raise


def listed_session(server, path, opened):
    """The server's record of the page's session, once it lists it (a moment after the page has
    it; longer on a loaded machine)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (listed := [s for s in api(server, "sessions") if s["id"] == opened["session"]]):
        assert time.monotonic() < deadline, (
            f"{path}: the server lists no session {opened} after {START_TIMEOUT_S} s"
        )
        time.sleep(0.5)
    session = listed[0]
    assert session["path"] == path and session["kernel"]["id"] == opened["kernel"], session
    return session


def click_run_all(page):
    """Run > Run All Cells."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


# The in-page widgets (toycore.widgets.in_page) in the notebook, and those their script built.
IN_PAGE_WIDGETS = f"""path => {{ const node = ({PANEL}).node;
  return [node.querySelectorAll('.toycore-inpage').length,
          node.querySelectorAll('.toycore-inpage[data-mounted]').length]; }}"""


def in_page_widgets(page, path):
    """[in-page widgets, those built], once every one is built or after 30 s (their script runs
    as JupyterLab renders the output, which may trail the kernel's idle on a loaded machine)."""
    try:
        page.wait_for_function(
            f"path => {{ const [found, built] = ({IN_PAGE_WIDGETS})(path); "
            "return found === built; }",
            arg=path,
            timeout=30_000,
        )
    except PlaywrightTimeout:
        pass  # the test reports which were not built
    return page.evaluate(IN_PAGE_WIDGETS, path)


def open_notebook(page, path):
    """The notebook as the reader's JupyterLab holds it, outputs included (nbformat JSON)."""
    return page.evaluate(f"path => ({PANEL}).content.model.toJSON()", path)


def record(name, **numbers):
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[name] = numbers
    RESULTS.write_text(json.dumps(results, indent=1))


# The chapter whose live explorer is tried; its Run All leaves it open for that test.
EXPLORER_CHAPTER = CHAPTERS[0]
# Chapters run two at a time, the longest first: a kernel each, on a machine's two cores.
AT_ONCE = 2
RUN_EXPLORER_TIMEOUT_S = 300


class Running:
    """One chapter open in its own page, Run All Cells clicked; ``poll`` says when it is done."""

    def __init__(self, browser, server, name):
        self.name, self.path = name, f"chapters/{name}"
        self.context, self.page, self.session = open_chapter(browser, server, name)
        self.pid = kernel_pid(self.session["kernel"]["id"])
        click_run_all(self.page)
        self.start, self.started = time.perf_counter(), False

    def poll(self):
        """The seconds Run All took once no cell is queued or running and the kernel is idle
        (None before)."""
        elapsed = time.perf_counter() - self.start
        prompts = self.page.evaluate(f"path => {PROMPTS}", self.path)
        # Started: a cell queued, running or run (a short chapter may be done by the first poll,
        # which waits while the next chapter's page opens).
        self.started = self.started or any(
            "*" in text or re.search(r"\d", text) for text in prompts
        )
        if not self.started:
            assert elapsed < 120, f"{self.name}: Run All started no cell in 120 s: {prompts}"
        elif not any("*" in text for text in prompts) and self.page.evaluate(
            KERNEL_IDLE, self.path
        ):
            return elapsed
        assert elapsed < RUN_ALL_TIMEOUT_S, f"{self.name}: Run All not done in {elapsed:.0f} s"
        return None


@pytest.fixture(scope="module")
def chapters_run(browser, server):
    """Every chapter run with Run All in JupyterLab, AT_ONCE at a time: {name: (seconds, kernel
    peak memory, the notebook with its outputs, [in-page widgets, those built]) or the exception
    that stopped it}. The explorer chapter's page stays open, its kernel running, as
    ``chapters_run[EXPLORER_CHAPTER + ' page']`` = (context, page)."""
    outcomes, waiting, running = {}, sorted(CHAPTERS, reverse=True), []
    while waiting or running:
        while waiting and len(running) < AT_ONCE:
            name = waiting.pop(0)
            try:
                running.append(Running(browser, server, name))
            except Exception as error:  # noqa: BLE001 (reported by that chapter's test)
                outcomes[name] = error
        for chapter in list(running):
            try:
                seconds = chapter.poll()
                if seconds is None:
                    continue
                outcomes[chapter.name] = (
                    seconds,
                    peak_memory(chapter.pid),
                    open_notebook(chapter.page, chapter.path),
                    in_page_widgets(chapter.page, chapter.path),
                )
            except Exception as error:  # noqa: BLE001 (reported by that chapter's test)
                outcomes[chapter.name] = error
            running.remove(chapter)
            if chapter.name == EXPLORER_CHAPTER and not isinstance(
                outcomes[chapter.name], Exception
            ):
                outcomes[f"{chapter.name} page"] = (chapter.context, chapter.page)
            else:
                chapter.context.close()
                api(server, f"sessions/{chapter.session['id']}", method="DELETE")
        time.sleep(0.5)
    yield outcomes
    if f"{EXPLORER_CHAPTER} page" in outcomes:
        outcomes[f"{EXPLORER_CHAPTER} page"][0].close()


@pytest.mark.parametrize("name", CHAPTERS)
def test_a_chapter_runs_all_cells_in_jupyterlab_with_no_error_within_binders_memory(
    chapters_run, name
):
    if isinstance(chapters_run[name], Exception):
        raise chapters_run[name]
    seconds, peak, notebook, _ = chapters_run[name]
    record(name, run_all_s=round(seconds, 1), kernel_peak_mib=round(peak / 2**20))
    log(f"binder: {name}: Run All in {seconds:.0f} s, kernel peak memory {peak / 2**20:.0f} MiB")
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    errors = [
        (index, output["ename"], output["evalue"])
        for index, cell in enumerate(code)
        for output in cell["outputs"]
        if output["output_type"] == "error"
    ]
    assert errors == [], f"{name}: cells with errors: {errors}"
    not_run = [index for index, cell in enumerate(code) if cell["execution_count"] is None]
    assert not_run == [], f"{name}: code cells that did not run: {not_run}"
    assert peak < BINDER_MEMORY_LIMIT, f"{name}: the kernel peaked at {peak / 2**30:.2f} GiB"


def test_the_in_page_widgets_build_themselves_in_jupyterlab_too(chapters_run):
    outcomes = {name: chapters_run[name] for name in CHAPTERS}
    failed = [name for name, outcome in outcomes.items() if isinstance(outcome, Exception)]
    counts = {name: outcome[3] for name, outcome in outcomes.items() if name not in failed}
    assert sum(found for found, _ in counts.values()) >= 2, f"in-page widgets found: {counts}"
    unbuilt = {name: (found, built) for name, (found, built) in counts.items() if built != found}
    assert unbuilt == {}, f"(widgets, built) where JupyterLab did not run their script: {unbuilt}"


def figure_digest(image):
    """sha256 of the bytes an <img> shows (ipywidgets 8 serves them as a blob: URL)."""
    data = image.evaluate(
        "img => fetch(img.src).then(r => r.arrayBuffer()).then(b => Array.from(new Uint8Array(b)))"
    )
    return hashlib.sha256(bytes(data)).hexdigest()


def test_moving_a_live_explorers_control_and_pressing_run_changes_its_figure(
    browser, server, chapters_run
):
    # The chapter as Run All left it; when that failed, opened and run again here.
    if f"{EXPLORER_CHAPTER} page" in chapters_run:
        context, page = chapters_run.pop(f"{EXPLORER_CHAPTER} page")
    else:
        chapter = Running(browser, server, EXPLORER_CHAPTER)
        while chapter.poll() is None:
            time.sleep(0.5)
        context, page = chapter.context, chapter.page
    try:
        explorer = (
            page.locator(".jp-OutputArea-output")
            .filter(has=page.locator("button", has_text=re.compile(r"^Run$")))
            .last
        )
        image = explorer.locator("img").first
        image.wait_for(timeout=START_TIMEOUT_S * 1000)
        before = figure_digest(image)
        seed = explorer.locator(".widget-slider").filter(
            has=page.locator(".widget-label", has_text=re.compile(r"^seed$"))
        )
        readout = seed.locator(".widget-readout")
        assert readout.inner_text() == "0"
        seed.locator(".noUi-handle").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function("el => el.textContent === '1'", arg=readout.element_handle())
        explorer.locator("button", has_text=re.compile(r"^Run$")).click()
        # Run trains a model in the kernel: seconds when warm, longer on a loaded machine.
        deadline = time.monotonic() + RUN_EXPLORER_TIMEOUT_S
        after = before
        while after == before and time.monotonic() < deadline:
            time.sleep(1)
            after = figure_digest(explorer.locator("img").first)
    finally:
        context.close()
    assert after != before, (
        f"the live explorer's figure did not change in {RUN_EXPLORER_TIMEOUT_S} s after Run "
        "with seed 1"
    )
