"""Build the whole book in the `ci` profile once, then check what a reader would get."""

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from toycore import book
from toycore.book import config, execute
from toycore.cache import PACKAGE
from toycore.claims import unexpected_verdicts
from toycore.paths import REPO_ROOT


def chapter_pages(build_dir):
    return {p.stem: build_dir / "html" / "chapters" / f"{p.stem}.html" for p in config.chapters()}


def test_index_and_every_chapter_page_exist(built):
    build_dir, index = built
    assert index.exists()
    for page in chapter_pages(build_dir).values():
        assert page.exists()


def test_chapter_pages_have_figures_widgets_and_no_errors(built):
    build_dir, _ = built
    for stem, page in chapter_pages(build_dir).items():
        html = page.read_text()
        soup = BeautifulSoup(html, "html.parser")
        images = [
            page.parent / img["src"]
            for img in soup.find_all("img")
            if img.get("src", "").startswith("../_images/")
        ]
        assert len(images) >= 5, f"{stem}: only {len(images)} figures"
        contents = [path.read_bytes() for path in images]
        assert len(set(contents)) == len(contents), f"{stem}: a figure is shown twice"
        state = soup.find("script", type="application/vnd.jupyter.widget-state+json")
        assert state is not None, f"{stem}: no embedded widget state"
        models = json.loads(state.string)["state"]
        assert any(m["model_name"] == "StackModel" for m in models.values())
        assert any(m["model_name"] == "LinkModel" for m in models.values())
        views = soup.find_all("script", type="application/vnd.jupyter.widget-view+json")
        in_page = soup.select(".toycore-inpage")  # widgets the page's own script builds
        assert len(views) >= 1 and len(views) + len(in_page) >= 2, f"{stem}: too few explorers"
        assert "Traceback" not in html and "output stderr" not in html
        # each claim's row is anchored once, in its section's table (the findings page's link)
        anchored = re.findall(r'id="(claim-[\w-]+)"', html)
        assert len(anchored) == len(set(anchored)), f"{stem}: a claim's anchor twice"
        # papermill's injected parameters stay out of the page; the chapter's own cell shows
        assert "# Parameters" not in soup.get_text() and "profile = None" in soup.get_text()
        assert not re.search(r"\b(Error|Exception):", soup.get_text()), f"{stem}: error text"
        # each chapter shows the model it trains, quoted from toycore
        listings = [block.get_text() for block in soup.select(".literal-block-wrapper")]
        assert any("toycore/models.py" in text and "def " in text for text in listings), stem


def test_ledgers_are_written_pass_and_reach_the_intro(built):
    build_dir, _ = built
    for stem in chapter_pages(build_dir):
        rows = json.loads((build_dir / "claims" / f"{stem}.json").read_text())
        assert rows and all(r["profile"] == "ci" for r in rows)
        unexpected = unexpected_verdicts(rows)
        assert not unexpected, f"{stem}: claims whose verdict changed in ci: {unexpected}"
        # a section's table is shown when its cell ends: a known failure's explanation that the
        # chapter checks in a later cell would read there as "not run"
        page = (build_dir / "html" / "chapters" / f"{stem}.html").read_text()
        checked = {r["id"] for r in rows}
        early = set(
            re.findall(
                r"its explanation <a href=\"#[\w-]+\"><code>([\w.]+)</code></a> was not run", page
            )
        )
        assert not early & checked, f"{stem}: shown before the cell that checks it: {early}"
    intro = (build_dir / "html" / "intro.html").read_text()
    assert "do not reproduce" in intro  # the summary table replaced the marker
    for stem in chapter_pages(build_dir):
        assert f"chapters/{stem}.html" in intro


def test_the_findings_page_lists_every_failure_and_slip_with_a_link_to_its_row(built):
    build_dir, _ = built
    page = BeautifulSoup((build_dir / "html" / "findings.html").read_text(), "html.parser")
    text = " ".join(table.get_text() for table in page.select("table.findings"))
    for stem in chapter_pages(build_dir):
        rows = json.loads((build_dir / "claims" / f"{stem}.json").read_text())
        for row in rows:
            if not row["passed"] and not row["outside_regime"]:
                assert row["claim"] in text, f"{stem}: {row['id']} is not on the findings page"
                assert row["why"] in text, f"{stem}: {row['id']}'s explanation is missing"
        fixes = json.loads((build_dir / "claims" / "corrections" / f"{stem}.json").read_text())
        assert all(entry["fix"] in text for entry in fixes)
    # every failure of this build is explained (one only at the texts' sizes may not be yet)
    for row in page.select("table.findings tr"):
        cells = [cell.get_text() for cell in row.find_all("td")]
        if len(cells) == 5 and cells[3].startswith("does not reproduce"):
            assert "unexpected" not in cells[2], cells
    # every link to a claim's row lands on that row of its chapter's page
    anchors = {}  # each chapter page's ids, read once: the pages are megabytes
    for link in page.select('table.findings a[href*="#claim-"]'):
        target, anchor = link["href"].split("#")
        if target not in anchors:
            html = (build_dir / "html" / target).read_text()
            anchors[target] = set(re.findall(r'\bid="([^"]+)"', html))
        assert anchor in anchors[target], link["href"]


def probe_notebook(path, *sources):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


def test_a_failing_cell_fails_the_build_naming_chapter_and_cell(tmp_path):
    notebook = probe_notebook(tmp_path / "_failing_probe.ipynb", "profile = None", "1 / 0")
    with pytest.raises(
        book.BuildError, match=r"_failing_probe.ipynb: cell 1 .*`1 / 0`.*ZeroDivisionError"
    ):
        execute.execute_chapter(notebook, tmp_path / "out.ipynb", "ci")


def test_a_cell_past_the_profiles_time_limit_fails_the_build_naming_the_chapter(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(execute.CELL_TIMEOUT_S, "ci", 2)
    notebook = probe_notebook(
        tmp_path / "_slow_probe.ipynb", "profile = None", "import time\ntime.sleep(300)"
    )
    start = time.perf_counter()
    with pytest.raises(
        book.BuildError,
        match=r"_slow_probe.ipynb: a cell ran past the ci profile's 2 s"
        r"(.|\n)*time.sleep\(300\)",
    ):
        execute.execute_chapter(notebook, tmp_path / "out.ipynb", "ci")
    # a kernel's start on a busy 2-core machine included, far less than the cell's 300 s
    assert time.perf_counter() - start < 120


def test_a_kernel_that_dies_fails_the_build_naming_chapter_and_cell(tmp_path):
    import nbformat

    notebook = probe_notebook(
        tmp_path / "_dying_probe.ipynb",
        "profile = None",
        "x = 1",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "y = 2",
    )
    output = tmp_path / "out.ipynb"
    with pytest.raises(
        book.BuildError,
        match=r"_dying_probe.ipynb: the kernel died during cell 2 "
        r"\(counting from 0, starting `import os, signal`\)",
    ):
        execute.execute_chapter(notebook, output, "ci")
    # The executed copy says which cell failed and that the one after it never ran.
    statuses = [
        cell.metadata.papermill["status"]
        for cell in nbformat.read(output, as_version=4).cells
        if "injected-parameters" not in cell.metadata.get("tags", [])
    ]
    assert statuses == ["completed", "completed", "failed", "pending"]


def test_a_kernel_that_dies_as_it_starts_fails_the_build_naming_the_chapter(tmp_path):
    # a sitecustomize on the kernel's path that ends any ipykernel before it binds a socket
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import os, sys\nif 'ipykernel_launcher' in ' '.join(sys.orig_argv):\n    os._exit(3)\n"
    )
    notebook = probe_notebook(tmp_path / "_unborn_probe.ipynb", "profile = None", "x = 1")
    path = os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))
    with execute.environment(PYTHONPATH=path):
        with pytest.raises(
            book.BuildError, match=r"_unborn_probe.ipynb: the kernel died as it started"
        ):
            execute.execute_chapter(notebook, tmp_path / "out.ipynb", "ci")


def test_a_chapters_kernel_talks_over_unix_sockets_in_a_folder_of_its_own(tmp_path):
    """Over TCP the manager picks ports that the kernel binds a moment later; one taken in
    between by another process kills the kernel at its start. A chapter's kernel binds no TCP
    port, and its sockets' folder is gone once the chapter ends."""
    import nbformat

    notebook = probe_notebook(
        tmp_path / "_transport_probe.ipynb",
        "profile = None",
        "from ipykernel.kernelapp import IPKernelApp\n"
        "app = IPKernelApp.instance()\n"
        "print(app.transport, app.ip)",
    )
    output = tmp_path / "out.ipynb"
    execute.execute_chapter(notebook, output, "ci")
    transport, ip = nbformat.read(output, as_version=4).cells[-1].outputs[0].text.split()
    assert transport == "ipc"
    assert Path(ip).parent.name.startswith("tk-")
    assert not Path(ip).parent.exists()


def test_an_edit_anywhere_in_toycore_executes_a_chapter_again(tmp_path):
    """The execution key reads every file of the package, its sizes and experiments included,
    not only the build's own (it once read toycore/book alone, and a changed size reused the
    execution made before it)."""
    package = tmp_path / "toycore"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    notebook = REPO_ROOT / "chapters" / "03_incidental_polysemanticity.ipynb"
    before = execute.execution_key(notebook, "ci", "cpu", package)
    assert execute.execution_key(notebook, "ci", "cpu", package) == before
    sizes = package / "sizes.py"
    sizes.write_text(sizes.read_text().replace("range(16)", "range(17)", 1))
    assert execute.execution_key(notebook, "ci", "cpu", package) != before


def test_a_chapter_is_executed_again_only_when_something_it_reads_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TOYCORE_BUILD_DIR", str(tmp_path))  # the ledgers go to its claims/
    runs, claims = tmp_path / "runs.txt", tmp_path / "claims"
    # the probe counts its executions and writes its ledger, as a chapter's kernel does
    cell = (
        f"from pathlib import Path\nwith open({str(runs)!r}, 'a') as f: f.write('x')\n"
        f"Path({str(claims)!r}).mkdir(exist_ok=True)\n"
        f"Path({str(claims / '_counting_probe.json')!r}).write_text('[]')"
    )
    notebook = probe_notebook(tmp_path / "_counting_probe.ipynb", "profile = None", cell)

    def run(profile, output, recorded=False):
        seconds = execute.run_chapter(notebook, tmp_path / output, profile, "cpu", recorded)
        return seconds, runs.read_text().count("x"), (claims / "_counting_probe.json").read_text()

    first = run("ci", "first.ipynb")
    assert first[0] > 0 and first[1:] == (1, "[]")
    (claims / "_counting_probe.json").unlink()  # a new build folder: no ledger yet
    assert run("ci", "again.ipynb") == (None, 1, "[]")  # reused: executed once, ledger back
    assert (tmp_path / "again.ipynb").read_bytes() == (tmp_path / "first.ipynb").read_bytes()
    assert run("cpu", "cpu.ipynb")[1] == 2  # another profile: executed
    probe_notebook(notebook, "profile = None", cell + "  # edited")
    assert run("ci", "edited.ipynb")[1] == 3  # the notebook changed: executed
    kept = [p.name for p in (tmp_path / "cache" / "executed").iterdir() if p.is_dir()]
    assert sorted(name.rsplit("-", 1)[0] for name in kept) == [  # the edited one replaced
        "_counting_probe-ci-cpu",
        "_counting_probe-cpu-cpu",
    ]
    assert run("paper", "paper.ipynb")[1] == 4  # another profile: executed
    assert run("paper", "paper.ipynb")[1] == 4  # reused, as in any profile
    # a build that records its run (the paper profile's, or one given a records folder)
    # always executes
    assert run("paper", "paper.ipynb", recorded=True)[1] == 5
    assert run("paper", "paper.ipynb", recorded=True)[1] == 6


# The probe notebook as the whole book, built by `python -m toycore.book` as a user would.
BOOK_OF_ONE = """
import sys
from pathlib import Path
from toycore.book import config
from toycore.book.__main__ import main
config.chapters = lambda root=None: [Path(sys.argv[1])]  # the probe is the whole book
sys.exit(main(["--profile", "ci", "--device", "cpu", "--jobs", sys.argv[2], "--no-html",
                    "--build-dir", sys.argv[3]]))
"""


def started_as_from_a_terminal(script, *arguments):
    """``python -c script arguments`` in a session of its own, so that Ctrl-C (SIGINT to the
    foreground process group) reaches it and its workers as a terminal would send it, and
    nothing else; SIGINT at its default even when these tests run with it ignored (a
    background job's), which Python would inherit."""
    import signal
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-c", script, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_ends_the_build_in_one_line_naming_chapter_and_cell(tmp_path, jobs):
    import os
    import signal

    import nbformat

    notebook = probe_notebook(
        tmp_path / "_sleeping_probe.ipynb", "profile = None", "import time\ntime.sleep(300)"
    )
    build_dir = tmp_path / "build"
    executed = build_dir / "source" / "chapters" / notebook.name
    process = started_as_from_a_terminal(BOOK_OF_ONE, str(notebook), str(jobs), str(build_dir))
    deadline = time.time() + 120
    while time.time() < deadline:  # until papermill has started the sleeping cell
        try:
            cells = nbformat.read(executed, as_version=4).cells
            if cells[-1].metadata.papermill.get("start_time"):
                break
        except (OSError, ValueError, AttributeError, IndexError):
            pass
        time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("the probe's sleeping cell never started")
    start = time.perf_counter()
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    # the build did not wait for the cell's 300 s (closing its cluster included)
    assert time.perf_counter() - start < 60
    assert process.returncode == 130
    assert "Traceback" not in stderr, stderr
    # nor any warning from Dask or from multiprocessing's tracker of the stopped workers
    assert not re.search(r"distributed|resource_tracker|Warning", stderr), stderr
    assert (
        stderr.strip()
        .splitlines()[-1]
        .endswith(
            "_sleeping_probe.ipynb, cell 1 (counting from 0, starting `import time`); "
            "finished results are kept"
        )
    ), stderr


# The same, with the shard cluster's start slowed and announced in a file: Ctrl-C lands there.
BOOK_OF_ONE_SLOW_CLUSTER = (
    """
import contextlib, sys, time
from pathlib import Path
from toycore import shards
real = shards.local_cluster
@contextlib.contextmanager
def slow(*args):
    Path(sys.argv[4]).touch()
    time.sleep(5)
    with real(*args) as cluster:
        yield cluster
shards.local_cluster = slow
"""
    + BOOK_OF_ONE
)


def test_ctrl_c_while_the_shard_cluster_starts_ends_the_build_in_one_line(tmp_path):
    import os
    import signal

    notebook = probe_notebook(tmp_path / "_probe.ipynb", "profile = None", "x = 1")
    starting = tmp_path / "cluster-starting"
    arguments = [str(notebook), "2", str(tmp_path / "build"), str(starting)]
    process = started_as_from_a_terminal(BOOK_OF_ONE_SLOW_CLUSTER, *arguments)
    deadline = time.time() + 120  # the build's imports, on a busy machine
    while not starting.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert starting.exists(), "the cluster never started"
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    # answered once the cluster is up (a Ctrl-C ignored there was lost: the build went on)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert not re.search(r"distributed|resource_tracker|Warning", stderr), stderr
    assert stderr.strip().splitlines()[-1] == "interrupted; finished results are kept", stderr
    assert not (tmp_path / "build" / "source" / "chapters" / notebook.name).exists()


def test_the_shard_workers_killed_at_the_builds_end_are_not_restarted(tmp_path):
    """Dask's nanny restarts a worker whose process dies; one restarted after the build killed
    the workers found its scheduler closed under it and logged a traceback to the build's
    stderr (a flaky Ctrl-C test, on a busy machine)."""
    from distributed.core import Status

    from toycore import shards

    with shards.local_cluster(1) as cluster:
        (nanny,) = cluster.workers.values()
        killed = nanny.pid
        execute._kill_shard_workers(cluster)
        deadline = time.time() + 60
        while nanny.status != Status.closed and time.time() < deadline:
            assert nanny.pid in (None, killed), "the nanny restarted its worker"
            time.sleep(0.05)
        assert nanny.status == Status.closed


def _distributed_log_level():
    import logging

    return logging.getLogger("distributed").getEffectiveLevel()


def _dask_profiling():
    import dask

    return dask.config.get("distributed.worker.profile.enabled")


def test_the_shard_workers_do_not_profile_themselves():
    from dask.distributed import Client

    from toycore import shards

    with shards.local_cluster(1) as cluster, Client(cluster.scheduler_address) as client:
        assert set(client.run(_dask_profiling).values()) == {False}


def _warnings_shown(*messages):
    """How many of ``messages``, warned as UserWarnings here, this process's filters show."""
    import warnings

    with warnings.catch_warnings(record=True) as shown:
        for message in messages:
            warnings.warn(message, UserWarning)
    return len(shown)


def test_dasks_slow_scratch_folder_warning_is_silenced_in_workers_and_here():
    """Dask warns when a server's scratch folder took over a second to set up, which a busy
    machine alone causes; in the build's stderr it would fail the Ctrl-C tests' check for
    warnings."""
    from dask.distributed import Client

    from toycore import shards

    slow = f"{shards.SCRATCH_WARNING}. (1.20s) This is often due to ..."
    with shards.local_cluster(1) as cluster, Client(cluster.scheduler_address) as client:
        other = "another warning, which still shows"
        assert set(client.run(_warnings_shown, slow, other).values()) == {1}
    assert _warnings_shown(slow, other + " here") == 1
    # a second cluster does not add the filter to the workers' environment again
    with shards.local_cluster(1):
        assert os.environ["PYTHONWARNINGS"].count(shards.SCRATCH_WARNING) == 1


def test_the_shard_workers_log_nothing_below_critical_a_restarted_one_included():
    """A worker alive as the cluster closes under it logged its lost scheduler into the build's
    stderr (Ctrl-C on a busy machine); the workers' own logging is what keeps it out."""
    import logging
    import os
    import signal

    from dask.distributed import Client

    from toycore import shards

    with shards.local_cluster(1) as cluster, Client(cluster.scheduler_address) as client:
        assert set(client.run(_distributed_log_level).values()) == {logging.CRITICAL}
        (nanny,) = cluster.workers.values()
        killed = nanny.pid
        os.kill(killed, signal.SIGKILL)  # its nanny starts another
        deadline = time.time() + 60
        while nanny.pid in (None, killed) and time.time() < deadline:
            time.sleep(0.1)
        client.wait_for_workers(1, timeout=60)
        assert set(client.run(_distributed_log_level).values()) == {logging.CRITICAL}


def test_a_chapter_process_that_dies_fails_the_build_in_one_line_naming_chapter_and_cell(tmp_path):
    import subprocess
    import sys

    # The kernel kills the process that runs its chapter (papermill, in a worker of the pool).
    notebook = probe_notebook(
        tmp_path / "_killer_probe.ipynb",
        "profile = None",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    )
    result = subprocess.run(
        [sys.executable, "-c", BOOK_OF_ONE, str(notebook), "2", str(tmp_path / "build")],
        capture_output=True,
        text=True,
        timeout=300,  # a pool, its kernel and the shards' cluster, started on a busy machine
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert re.search(
        r"book build failed: a chapter's process died \(killed, or out of memory\) "
        r"while running \S*_killer_probe.ipynb at cell 1 \(counting from 0, "
        r"starting `import os, signal`\)",
        result.stderr,
    ), result.stderr


def test_a_second_build_in_the_same_folder_waits_for_the_first_saying_so(tmp_path):
    import threading

    said, entered = [], threading.Event()

    def second_build():
        with book.build_lock(tmp_path, said.append):
            entered.set()

    with book.build_lock(tmp_path, print):
        waiting = threading.Thread(target=second_build)
        waiting.start()
        assert not entered.wait(1.0)  # the second build does not start while the first runs
    assert entered.wait(10.0)  # and starts as soon as the first is done
    waiting.join()
    assert said == [
        f"another build is using {tmp_path} (process {__import__('os').getpid()}); "
        f"waiting for it to finish ..."
    ]


def test_the_build_leaves_the_callers_environment_as_it_was(built, monkeypatch):
    import os

    build_dir, _ = built
    assert os.environ.get("TOYCORE_BUILD_DIR") != str(build_dir)  # the real build left nothing
    monkeypatch.setenv("TOYCORE_PROFILE", "cpu")
    monkeypatch.delenv("TOYCORE_BUILD_DIR", raising=False)
    with execute.environment(TOYCORE_PROFILE="ci", TOYCORE_BUILD_DIR="/elsewhere"):
        assert os.environ["TOYCORE_PROFILE"] == "ci"
    assert os.environ["TOYCORE_PROFILE"] == "cpu" and "TOYCORE_BUILD_DIR" not in os.environ


def test_unknown_profile_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="profile must be one of"):
        book.build("gpu", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_pages_load_every_script_from_the_book_itself(built):
    build_dir, _ = built
    html = build_dir / "html"
    for page in [html / "intro.html", *chapter_pages(build_dir).values()]:
        soup = BeautifulSoup(page.read_text(), "html.parser")
        sources = [script["src"] for script in soup.find_all("script", src=True)]
        assert not [src for src in sources if "://" in src or src.startswith("//")], page.name
        for src in sources:
            assert (page.parent / src.split("?")[0]).resolve().is_file(), (
                f"{page.name}: {src} missing"
            )
    chapter = BeautifulSoup(chapter_pages(build_dir)["05_persian_rug"].read_text(), "html.parser")
    sources = " ".join(script["src"] for script in chapter.find_all("script", src=True))
    for script in (
        "vendor/requirejs/require.js",
        "vendor/html-manager/dist/embed-amd.js",
        "vendor/mathjax/es5/tex-mml-chtml.js",
    ):
        assert script in sources


def test_every_reference_is_cited_and_the_intro_cites_the_four_texts():
    from toycore.paths import REPO_ROOT

    entries = set(re.findall(r"^@\w+\{([^,]+),", (REPO_ROOT / "references.bib").read_text(), re.M))
    intro = (REPO_ROOT / "intro.md").read_text()
    texts = intro + "".join(notebook.read_text() for notebook in config.chapters())
    cited = set(re.findall(r"\{cite:[pt]\}`([^`]+)`", texts))
    assert cited <= entries and entries <= cited, cited ^ entries
    for source in (
        "notes_toy_autoencoding",
        "elhage2022superposition",
        "lecomte2023incidental",
        "persianrug2024",
    ):
        assert f"`{source}`" in intro
