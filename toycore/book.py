"""Build the book: execute every chapter with papermill, then render the executed copies.

    python -m toycore.book --profile cpu        # what `make book` runs

1. The book's sources (_config.yml, _toc.yml, the pages intro.md, findings.md and
   reproducing.md, references.bib, _static/) are copied to ``<build>/source``, and toycore's
   modules beside them, which the chapters quote with ``{literalinclude} /toycore/<module>.py``;
   each chapter in _toc.yml is executed by papermill with its ``profile`` and ``device``
   parameters into ``<build>/source/chapters/``. Committed notebooks are never written to.
   Chapters run side by side in worker processes (``--jobs``, default one per core on the CPU,
   one on a GPU), the longest of the last build first, and their sweeps' shards on a local Dask
   cluster of as many workers; the workers, and the chapters running at once, each have an equal
   share of the cores as torch threads (one each on two cores: two processes with one thread
   each do not slow each other there, with two threads each they did, 3.5x); a chapter executing
   alone computes its own cells on every core.
2. Expensive results go through ``toycore.cache``, so re-executing with nothing changed is quick;
   and a chapter's executed copy is kept there too (``run_chapter``), so that a chapter none of
   whose inputs changed is not executed again.
3. The chapters' claims ledgers (``<build>/claims/*.json``) are summarised into the intro page,
   beside the paper profile's recorded verdicts (``toycore.records``), and make the findings
   page (every claim that does not reproduce, every slip repaired); a ``paper`` build
   records each chapter's ledger with its provenance in ``results/paper/``.
4. Sphinx renders ``<build>/source`` into ``<build>/html`` with execution off; the widget state
   papermill saved is embedded in the pages. Warnings are errors.
5. Before any of this, ``toycore.offline`` fetches pinned require.js, the ipywidgets HTML manager
   and MathJax from the npm registry into ``<build>/offline``, and the pages load them from the
   book itself, so the HTML shows widgets and math with no network (or from CDNs, with a warning,
   when the registry cannot be reached).
A failing cell stops the build, naming the chapter and the cell; no page with a traceback is
published. ``--chapters`` executes (and, in the paper profile, records) only the chapters named,
for a machine whose sessions are too short for the whole book; it renders no HTML, nor does
``--no-html``, with which Binder's image build fills the result cache.
"""

import argparse
import concurrent.futures
import contextlib
import fcntl
import gc
import hashlib
import html
import importlib.metadata
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat
import papermill
import yaml
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from papermill.exceptions import PapermillExecutionError
from traitlets.config import Config

from . import devices, offline, records, shards
from .cache import cache_root
from .checks import check_size
from .claims import anchor, ledger_files, load_corrections, load_ledgers, outside
from .paths import REPO_ROOT
from .paths import build_dir as default_build_dir
from .profiles import PROFILES, resolve_profile

BOOK_FILES = (
    "_config.yml",
    "_toc.yml",
    "intro.md",
    "findings.md",
    "reproducing.md",
    "references.bib",
)
LEDGER_MARKER = "<!-- claims-ledger -->"
PAPER_MARKER = "<!-- paper-ledger -->"
FINDINGS_MARKER = "<!-- findings -->"
# The text each chapter follows (its title and bibliography key), for the findings page.
TEXTS = {
    "01_linear_autoencoders": (
        "Notes on the mathematics of toy autoencoding problems",
        "notes_toy_autoencoding",
    ),
    "02_relu_output_model": ("Toy Models of Superposition", "elhage2022superposition"),
    "03_incidental_polysemanticity": ("Incidental polysemanticity", "lecomte2023incidental"),
    "04_sparsity_from_noise": ("Incidental polysemanticity", "lecomte2023incidental"),
    "05_persian_rug": ("The Persian Rug", "persianrug2024"),
}
LEDGER_ANCHOR = "claims-ledger"  # the id of each chapter's "## Claims ledger" heading
# The longest a single cell may run, per profile: a stuck or pathologically slow cell fails the
# build naming its chapter instead of silently using up CI's time. `paper` runs on a GPU, unbounded.
CELL_TIMEOUT_S = {"ci": 600, "cpu": 3600, "paper": None}
REPOSITORY_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}")
BINDERHUB_URL = "https://mybinder.org"


class BuildError(RuntimeError):
    pass


class BuildInterrupted(RuntimeError):
    """Ctrl-C during a build; the message says where it stopped."""


def chapters(root=REPO_ROOT):
    """The chapter notebooks listed in _toc.yml, in order (its other pages are Markdown)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    entries = [e["file"] for e in toc.get("chapters", []) if e["file"].startswith("chapters/")]
    return [root / f"{entry}.ipynb" for entry in entries]


def shown(notebook):
    """A notebook's path as messages give it: from the repository's root."""
    return os.path.relpath(notebook, REPO_ROOT)


def execute_chapter(notebook, output, profile, device=None):
    """Run one chapter with papermill; a failing or timed-out cell, or a kernel that dies,
    raises BuildError naming the chapter and the cell, and Ctrl-C BuildInterrupted."""
    timeout = CELL_TIMEOUT_S[resolve_profile(profile)]
    chapter = shown(notebook)
    try:
        papermill.execute_notebook(
            str(notebook),
            str(output),
            parameters={"profile": profile, "device": device},
            kernel_name="python3",
            cwd=str(notebook.parent),
            progress_bar=False,
            execution_timeout=timeout,
            # Killed when done: a kernel asked to shut down while its
            # cell runs (Ctrl-C) prints a traceback of its own.
            shutdown_kernel="immediate",
            # CurveZMQ keys where pyzmq has them: ipykernel otherwise warns at every start
            # that its TCP sockets are not encrypted
            config=Config(KernelManager=dict(transport_encryption="auto")),
        )
    except CellTimeoutError as error:
        raise BuildError(
            f"{chapter}: a cell ran past the {profile} profile's {timeout} s limit.\n{error}"
        ) from None
    except PapermillExecutionError as error:
        executed = nbformat.read(output, as_version=4)
        raise BuildError(
            f"{chapter}: {committed_cell(executed, error.cell_index, error.source)} raised "
            f"{error.ename}: {error.evalue}\nThe executed copy with the traceback is "
            f"{output}"
        ) from None
    except DeadKernelError:
        raise BuildError(
            f"{chapter}: the kernel died during {stopped_cell(output)} (it was "
            f"killed, or ran out of memory)"
        ) from None
    except KeyboardInterrupt as interrupt:
        _kill_kernels()
        with warnings.catch_warnings():  # nbclient's kernel cleanup, cut short, is moot now
            warnings.simplefilter("ignore", RuntimeWarning)
            interrupt.__traceback__ = None
            gc.collect()
        raise BuildInterrupted(
            f"interrupted during {chapter}, {stopped_cell(output)}; finished results are kept"
        ) from None
    hide_injected_parameters(output)


# What a chapter's execution reads besides its notebook and toycore's files: the libraries that
# compute it, draw it and write it down.
EXECUTION_STACK = (
    "torch",
    "numpy",
    "scipy",
    "matplotlib",
    "pillow",
    "ipywidgets",
    "ipython",
    "ipykernel",
    "jaxtyping",
    "joblib",
    "tqdm",
    "papermill",
    "nbformat",
    "nbclient",
)


def execution_key(notebook, profile, device):
    """A hash of everything executing ``notebook`` reads: the notebook, every file of toycore
    (its code, sizes and the in-page script), the paper records the pages quote, the profile,
    the device type, Python's version and those of EXECUTION_STACK."""
    digest = hashlib.sha256(f"{profile} {devices.resolve(device).type} {sys.version}".encode())
    package = Path(__file__).parent
    files = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path, name in [
        (notebook, notebook.name),
        *((path, str(path.relative_to(package))) for path in files),
        *((path, f"records/{path.name}") for path in sorted(records.FOLDER.glob("*.json"))),
    ]:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for name in EXECUTION_STACK:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{name}=={version}\0".encode())
    return digest.hexdigest()[:16]


def run_chapter(notebook, output, profile, device):
    """Execute one chapter into ``output``, or reuse the copy that an execution with the same
    ``execution_key`` kept in the result cache (``<cache>/executed/``) with the ledgers it saved:
    a rebuild with nothing changed executes nothing. A build that finds the chapter being
    executed by another waits for it, as for a result. A paper build always executes: it
    records the run. One copy is kept per chapter, profile and device type: a new one replaces
    the copy that older inputs kept. Returns the seconds the execution took, None when reused."""
    profile = resolve_profile(profile)
    if profile == "paper":
        start = time.perf_counter()
        execute_chapter(notebook, output, profile, device)
        return time.perf_counter() - start
    kind = f"{notebook.stem}-{profile}-{devices.resolve(device).type}"
    kept = cache_root() / "executed" / f"{kind}-{execution_key(notebook, profile, device)}"
    # the kept copies' names for the chapter's ledger files (the kernel saves them)
    ledgers = dict(zip(("claims.json", "corrections.json"), ledger_files(notebook.stem)))
    kept.parent.mkdir(parents=True, exist_ok=True)
    with open(kept.with_name(kept.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (kept / "executed.ipynb").exists():
            shutil.copy2(kept / "executed.ipynb", output)
            for name, path in ledgers.items():
                if (kept / name).exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(kept / name, path)
                else:
                    path.unlink(missing_ok=True)
            return None
        start = time.perf_counter()
        execute_chapter(notebook, output, profile, device)
        seconds = time.perf_counter() - start
        # kept whole or not at all: written aside, then renamed into place
        part = Path(tempfile.mkdtemp(dir=kept.parent, prefix=".part-"))
        shutil.copy2(output, part / "executed.ipynb")
        for name, path in ledgers.items():
            if path.exists():
                shutil.copy2(path, part / name)
        shutil.rmtree(kept, ignore_errors=True)  # a damaged copy, without its notebook
        try:
            os.rename(part, kept)
        except OSError:  # another build kept its copy first (one waiting on an unlinked lock)
            shutil.rmtree(part, ignore_errors=True)
    _forget_older_executions(kept, kind)
    return seconds


def _forget_older_executions(kept, kind):
    """Remove the copies of ``kind`` (chapter, profile, device type) that older inputs kept,
    except one a build is reading now."""
    for lock_file in kept.parent.glob(f"{kind}-*.lock"):
        older = lock_file.with_suffix("")
        if older == kept:
            continue
        with open(lock_file, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(older, ignore_errors=True)
            lock_file.unlink(missing_ok=True)


def hide_injected_parameters(output):
    """Keep papermill's cell of injected parameters out of the page (Jupyter Book's remove-cell
    tag): the chapter's own parameters cell, just above it, says what may be set."""
    executed = nbformat.read(output, as_version=4)
    for cell in executed.cells:
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
    nbformat.write(executed, output)


def _kill_kernels():
    """Kill this process's Jupyter kernels: Ctrl-C cuts papermill short before it shuts its
    kernel down, and the kernel would go on running its cell until it noticed us gone."""
    for process in Path("/proc").glob("[0-9]*"):  # Linux; elsewhere the kernel ends by itself
        try:
            parent = int((process / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid() and b"ipykernel" in (process / "cmdline").read_bytes():
                os.kill(int(process.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def committed_cell(executed, index, source):
    """Cell ``index`` (with ``source``) of papermill's executed copy, named as in the committed
    notebook: papermill inserts a cell of injected parameters, which that notebook lacks."""
    injected = [
        i
        for i, cell in enumerate(executed.cells)
        if "injected-parameters" in cell.metadata.get("tags", [])
    ]
    number = index - (1 if injected and injected[0] < index else 0)
    first_line = source.strip().splitlines()[0] if source.strip() else ""
    return f"cell {number} (counting from 0, starting `{first_line}`)"


def stopped_cell(output):
    """The cell a chapter's execution stopped in, without an error of its own (a dead kernel,
    Ctrl-C): the last cell papermill started in the executed copy ``output``. papermill then
    marks every cell completed; the copy is corrected to say which failed and which never ran."""
    for _ in range(20):  # a worker may still be writing it: wait up to 2 s for a whole file
        try:
            executed = nbformat.read(output, as_version=4)
            break
        except (OSError, ValueError):
            time.sleep(0.1)
    else:
        return "its start"
    started = [
        i
        for i, cell in enumerate(executed.cells)
        if cell.metadata.get("papermill", {}).get("start_time")
    ]
    if not started:
        return "its start"
    stopped = started[-1]
    for index, cell in enumerate(executed.cells[stopped:], start=stopped):
        if "papermill" in cell.metadata:
            cell.metadata.papermill["status"] = "failed" if index == stopped else "pending"
    partial = output.with_name(output.name + ".partial")  # whole or not at all: others read it
    nbformat.write(executed, partial)
    os.replace(partial, output)
    return committed_cell(executed, stopped, executed.cells[stopped].source)


def ledger_summary(ledgers, titles):
    """The intro page's table of every chapter's claims ledger, linking to each chapter's table."""
    lines = [
        "| chapter | profile | claims | reproduce | do not reproduce | outside the text's regime "
        "| ledger |",
        "|---|---|---|---|---|---|---|",
    ]
    failing = []
    for stem, rows in ledgers.items():
        tested = [row for row in rows if not outside(row)]
        passed = sum(row["passed"] for row in tested)
        profiles = ", ".join(sorted({row["profile"] for row in rows}))
        page = f"chapters/{stem}.ipynb"
        lines.append(
            f"| [{titles.get(stem, stem)}]({page}) | `{profiles}` | {len(rows)} | {passed} "
            f"| {len(tested) - passed} | {len(rows) - len(tested)} "
            f"| [table]({page}#{LEDGER_ANCHOR}) |"
        )
        failing += [
            f"- {titles.get(stem, stem)}: {row['claim']}"
            + (" (explained in the chapter)" if row["known_failure"] else " (**unexpected**)")
            for row in tested
            if not row["passed"]
        ]
    if failing:
        lines += ["", "Claims that did not reproduce in this build:", ""] + failing
    return "\n".join(lines)


def _verdict(row):
    """A ledger row's verdict in words, as the chapters' tables show it."""
    if outside(row):
        return "outside the text's regime"
    if row["passed"]:
        return "reproduces"
    return "<strong>does not reproduce</strong>" + (" (explained)" if row["known_failure"] else "")


def paper_comparison(ledgers, recorded, titles, codes):
    """The intro's claim-by-claim table: this build's verdict beside the paper profile's
    recorded one, with where and when that was recorded. ``recorded``: {chapter: record}
    (``toycore.records.load``); ``codes``: {chapter: its code's hash now}
    (``toycore.records.chapter_code``), to flag records made with other code."""
    lines = []
    for stem in list(ledgers) + [stem for stem in recorded if stem not in ledgers]:
        rows = {row["id"]: row for row in ledgers.get(stem, [])}
        record = recorded.get(stem)
        paper = {row["id"]: row for row in record["rows"]} if record else {}
        lines += [f"### [{titles.get(stem, stem)}](chapters/{stem}.ipynb)", ""]
        if record is None:
            lines.append("The paper profile has not been run for this chapter yet.")
        else:
            given = record["provenance"]
            changes = " with uncommitted changes" if given["uncommitted_changes"] else ""
            tested = [row for row in paper.values() if not outside(row)]
            held = f" of {record['partial']}" if record.get("partial") else ""
            lines.append(
                f"Paper profile{held} recorded {given['recorded']} on {given['device']} "
                f"(`{given['device_type']}`), torch {given['torch']}, commit "
                f"`{given['commit'][:10]}`{changes}, in {given['wall_time_s'] / 60:.1f} min "
                f"({given['chapters_at_once']} chapter(s) at a time): "
                f"{sum(row['passed'] for row in tested)} of {len(tested)} reproduce"
                + (
                    f", {len(paper) - len(tested)} outside the text's regime."
                    if len(tested) < len(paper)
                    else "."
                )
            )
            if record.get("partial"):
                lines.append(
                    " The other rows have not been run at the texts' sizes (**not run** below)."
                )
            if given["code"] != codes.get(stem):
                lines.append(
                    " This chapter's computing code has changed since the record was made."
                )
        build_profile = next(iter(rows.values()))["profile"] if rows else "?"
        table = [
            '<table class="paper-comparison"><tr><th>claim</th>'
            f"<th>this build (<code>{build_profile}</code>)</th><th>paper profile</th></tr>"
        ]
        for claim_id in list(rows) + [k for k in paper if k not in rows]:
            row = rows.get(claim_id) or paper[claim_id]
            here = _verdict(rows[claim_id]) if claim_id in rows else "not in this build"
            there = (
                _verdict(paper[claim_id])
                if claim_id in paper
                else "not run"
                if record is None or record.get("partial")
                else "not recorded"
            )
            table.append(
                f"<tr><td>{html.escape(row['claim'])}</td><td>{here}</td><td>{there}</td></tr>"
            )
        lines += ["", "".join(table) + "</table>", ""]
    return "\n".join(lines)


def _chapter(stem):
    """ "chapter 3" for ``03_incidental_polysemanticity``."""
    return f"chapter {int(stem.split('_')[0])}"


def _plain_verdict(row):
    """A row's verdict in words, or "not run" for a claim a record does not hold."""
    if row is None:
        return "not run"
    if outside(row):
        return "outside the text's regime"
    return "reproduces" if row["passed"] else "does not reproduce"


def _link(stem, row_anchors, claim_id):
    """A link to a claim's row in its section's table, else to the chapter's ledger."""
    target = anchor(claim_id) if anchor(claim_id) in row_anchors else LEDGER_ANCHOR
    return f'<a href="chapters/{stem}.html#{target}">{_chapter(stem)}</a>'


def findings(ledgers, corrections, recorded, anchors):
    """The findings page's body, grouped by text: the claims that do not reproduce, in this
    build or at the texts' sizes, each with the chapter's one-sentence explanation; the slips
    in the text that the chapters repair; and, apart, the claims checked outside a text's
    regime. ``corrections``: {chapter: entries} (``toycore.claims.load_corrections``);
    ``anchors``: {chapter: the row anchors its page has} (``row_anchors``)."""
    lines = []
    texts = {}
    for stem in ledgers:
        texts.setdefault(TEXTS[stem], []).append(stem)
    for (name, key), stems in texts.items():
        failing, repaired, beyond = [], [], []
        for stem in stems:
            here = {row["id"]: row for row in ledgers[stem]}
            record = recorded.get(stem)
            there = {row["id"]: row for row in record["rows"]} if record else {}
            page = anchors.get(stem, ())
            for claim_id in list(here) + [k for k in there if k not in here]:
                row = here.get(claim_id) or there[claim_id]
                rows = [r for r in (here.get(claim_id), there.get(claim_id)) if r]
                start = (
                    f"<tr><td>{html.escape(row['claim'])}</td>"
                    f"<td>{_link(stem, page, claim_id)}</td>"
                )
                if any(not outside(r) and not r["passed"] for r in rows):
                    why = next((r.get("why") for r in rows if r.get("why")), "")
                    if why:
                        why = html.escape(why)
                    elif any(r["known_failure"] for r in rows):  # recorded before why= existed
                        why = "explained in the chapter"
                    else:
                        why = "<strong>unexpected</strong>: not explained yet"
                    failing.append(
                        f"{start}<td>{why}</td><td>{_plain_verdict(here.get(claim_id))}</td>"
                        f"<td>{_plain_verdict(there.get(claim_id)) if record else 'no record'}"
                        "</td></tr>"
                    )
                elif all(outside(r) for r in rows):
                    beyond.append(
                        f"{start}<td>{html.escape(row['outside_regime'])}</td>"
                        f"<td>{'holds' if row['passed'] else 'does not hold'}</td></tr>"
                    )
            repaired += [
                f"<tr><td>{html.escape(entry['source'])}</td><td>{html.escape(entry['text'])}</td>"
                f"<td>{html.escape(entry['fix'])}</td>"
                f'<td><a href="chapters/{stem}.html">{_chapter(stem)}</a></td></tr>'
                for entry in corrections.get(stem, [])
            ]
        chapters = " and ".join(f"[{_chapter(stem)}](chapters/{stem}.ipynb)" for stem in stems)
        lines += [f"## {name}", "", f"{{cite:t}}`{key}`, checked in {chapters}.", ""]
        if failing:
            lines += [
                '<table class="findings"><caption>Claims that do not reproduce</caption>'
                "<tr><th>claim</th><th>chapter</th><th>why</th><th>this build</th>"
                "<th>the texts' sizes</th></tr>" + "".join(failing) + "</table>",
                "",
            ]
        else:
            lines += ["Every claim of this text that the book checks reproduces.", ""]
        if repaired:
            lines += [
                '<table class="findings"><caption>Slips in the text that the book repairs'
                "</caption><tr><th>where</th><th>the text has</th><th>the book</th>"
                "<th>chapter</th></tr>" + "".join(repaired) + "</table>",
                "",
            ]
        if beyond:
            lines += [
                '<table class="findings"><caption>Checked outside the text\'s regime (not '
                "counted)</caption><tr><th>claim</th><th>chapter</th><th>why outside</th>"
                "<th>here</th></tr>" + "".join(beyond) + "</table>",
                "",
            ]
    return "\n".join(lines)


def row_anchors(notebook):
    """The claim-row anchors an executed chapter's outputs hold."""
    return set(re.findall(r'id=\\?"(claim-[\w-]+)', notebook.read_text()))


def notebook_title(notebook):
    """The first Markdown heading of a notebook."""
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return notebook.stem


def repository(environ=os.environ):
    """The book's GitHub repository, ``owner/name``: ``$TOYCORE_REPOSITORY``, else the
    ``$GITHUB_REPOSITORY`` that GitHub Actions sets, else None (no repository, no buttons)."""
    name = environ.get("TOYCORE_REPOSITORY") or environ.get("GITHUB_REPOSITORY") or None
    if name is not None and not REPOSITORY_NAME.fullmatch(name):
        raise ValueError(
            f"TOYCORE_REPOSITORY / GITHUB_REPOSITORY must be a GitHub repository "
            f"as owner/name, e.g. toycore/toy-superposition-book; got {name!r}"
        )
    return name


def set_repository(config_file, name):
    """Point a _config.yml (the build's copy) at GitHub repository ``name``: the repository and
    issue buttons, and a Binder button on each chapter that opens it in JupyterLab. With no
    name, the book has none of these, rather than links to a repository that may not exist."""
    config = yaml.safe_load(config_file.read_text())
    buttons = config.setdefault("html", {})
    if name:
        config.setdefault("repository", {})["url"] = f"https://github.com/{name}"
        config.setdefault("launch_buttons", {})["binderhub_url"] = BINDERHUB_URL
    else:
        config.get("repository", {}).pop("url", None)
        config.get("launch_buttons", {}).pop("binderhub_url", None)
    for button in ("use_repository_button", "use_issues_button"):
        buttons[button] = bool(name)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))


def add_sphinx_config(config_file, settings):
    """Add settings to a _config.yml's ``sphinx.config`` (the build's copy, never the committed
    one)."""
    config = yaml.safe_load(config_file.read_text())
    config.setdefault("sphinx", {}).setdefault("config", {}).update(settings)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))


@contextlib.contextmanager
def environment(**variables):
    """Set environment variables for the duration of a block (papermill's kernels inherit them)."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def select_chapters(names=None):
    """The chapters to execute: all of _toc.yml's, or those named (by file stem, e.g.
    ``05_persian_rug``, or by its number, ``05``); a clear error for a name that is none."""
    notebooks = chapters()
    if not names:
        return notebooks
    chosen = []
    for name in names:
        matches = [nb for nb in notebooks if nb.stem == name or nb.stem.split("_")[0] == name]
        if len(matches) != 1:
            raise ValueError(
                f"no chapter {name!r}; the chapters are {', '.join(nb.stem for nb in notebooks)}"
            )
        chosen += [nb for nb in matches if nb not in chosen]
    return chosen


def check_jobs(jobs, device):
    """How many processes compute: ``jobs``, by default one per core on the CPU and one on a
    GPU (processes would take turns on it; one kernel runs each batched shard there in turn)."""
    if jobs is None:
        jobs = 1 if devices.resolve(device).type == "cuda" else (os.cpu_count() or 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1; got {jobs!r}")
    return jobs


@contextlib.contextmanager
def shard_cluster(jobs, threads, log):
    """A local Dask cluster of ``jobs`` workers for every chapter's shards, while the chapters
    run: the longest chapter's shards then spread over the cores that the shorter chapters
    leave free, instead of queueing in its own kernel. Yields its address, or None when the
    user's ``$TOYCORE_SCHEDULER`` names a cluster already (the kernels use that one)."""
    if shards.scheduler():
        yield None
        return
    with contextlib.ExitStack() as stack:
        with _interrupts_ignored():  # the workers inherit it
            cluster = stack.enter_context(shards.local_cluster(jobs, threads))
        log(f"  shards go to a local Dask cluster of {jobs} workers ({cluster.scheduler_address})")
        try:
            yield cluster.scheduler_address
        finally:
            _kill_shard_workers(cluster)


def _kill_shard_workers(cluster):
    """When the chapters are done, or after Ctrl-C: kill the shard workers at once, with Dask's
    warnings about their ends kept out of the log. Closing the cluster would wait for them: for
    a shard in flight after Ctrl-C, lost either way, each worker logging its cancelled task; and
    on a busy machine even idle workers outlast Dask's 4 s and are killed with a warning."""
    logging.getLogger("distributed").setLevel(logging.ERROR)
    for nanny in cluster.workers.values():
        with contextlib.suppress(OSError, TypeError):
            os.kill(nanny.pid, signal.SIGKILL)


@contextlib.contextmanager
def _interrupts_ignored():
    """Ctrl-C reaches the whole process group; processes started in this block ignore it, and
    the main process alone answers it, so that a build ends in one line, not a traceback each."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _worker_signals():
    """A chapter worker's initializer: Ctrl-C is the main process's to answer, and SIGTERM, with
    which the main process stops it, interrupts its chapter as Ctrl-C would in one process:
    papermill shuts the kernel down and the executed copy says where it stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def _stop_workers(pool):
    """Interrupt a process pool's chapters now (shutting it down would wait for them); each
    worker's chapter ends in BuildInterrupted, which its future reports."""
    workers = list(pool._processes.values())  # the pool has no public way to do this
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    pool.shutdown(wait=True)


def _execute_in_worker(notebook, output, profile, device, variables):
    """A worker process's chapter: its environment (the kernel inherits it), then
    ``run_chapter``."""
    os.environ.update(variables)
    return run_chapter(notebook, output, profile, device)


def execute_all(notebooks, source, profile, device, jobs, variables, log, on_done):
    """Execute the chapters, ``jobs`` at a time (and with ``jobs`` > 1, every shard on a local
    cluster of ``jobs`` workers, even for one chapter), longest first by ``<build>/timings.json``
    (with no timings, later chapters first: the book goes from small models to large ones).
    ``on_done(notebook, seconds)`` runs as each finishes (seconds None: its kept execution was
    reused, see ``run_chapter``). After a failure, the chapters still
    running finish (what they compute is cached), the others do not start, and the first
    failure (a failed cell, a dead kernel, a record refused) is raised."""
    timings_file = Path(variables["TOYCORE_BUILD_DIR"]) / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    known = timings.get(profile, {})
    order = sorted(reversed(notebooks), key=lambda nb: -known.get(nb.stem, float("inf")))

    def done(notebook, seconds):
        if seconds is not None:
            known[notebook.stem] = round(seconds, 1)
            timings_file.write_text(json.dumps({**timings, profile: known}, indent=1))
        on_done(notebook, seconds)

    if jobs == 1:
        with environment(**variables):
            for notebook in order:
                log(f"executing {shown(notebook)} (profile {profile}, {device}) ...")
                done(notebook, run_chapter(notebook, source / notebook.name, profile, device))
        return
    # Shard workers split the cores; so do the chapters' kernels, which wait while shards run:
    # a chapter executing alone computes its own cells on every core.
    threads = max(1, (os.cpu_count() or 1) // jobs)
    at_once = min(jobs, len(order))
    kernel_threads = max(1, (os.cpu_count() or 1) // at_once)
    variables = {**variables, "OMP_NUM_THREADS": str(kernel_threads)}
    log(
        f"executing {len(order)} chapter(s) (profile {profile}, {device}), {at_once} at a time, "
        f"torch on {kernel_threads} thread(s) in each chapter and {threads} in each of {jobs} "
        "shard workers ..."
    )
    failure = None
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch state forked
    # After Ctrl-C stopped the workers, multiprocessing's tracker would warn about semaphores
    # that it then cleans up itself; it inherits this setting if it starts now.
    quiet = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:resource_tracker:UserWarning"])
    )
    with (
        environment(PYTHONWARNINGS=quiet),
        shard_cluster(jobs, threads, log) as address,
        concurrent.futures.ProcessPoolExecutor(
            at_once, mp_context=context, initializer=_worker_signals
        ) as pool,
    ):
        if address:
            variables = {**variables, "TOYCORE_SCHEDULER": address}
        waiting, running = list(order), {}
        try:
            while waiting or running:
                # Hand the pool only what starts now: a queued chapter could not be held back later.
                while waiting and len(running) < at_once and failure is None:
                    notebook = waiting.pop(0)
                    running[
                        pool.submit(
                            _execute_in_worker,
                            notebook,
                            source / notebook.name,
                            profile,
                            device,
                            variables,
                        )
                    ] = notebook
                if not running:
                    break
                ended, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for future in ended:
                    notebook = running.pop(future)
                    try:
                        done(notebook, future.result())
                    except concurrent.futures.process.BrokenProcessPool:
                        # A worker was killed (SIGKILL, out of memory), and the pool ended
                        # every chapter it ran: which one's process died, it does not say.
                        if failure is None:
                            where = ", ".join(
                                f"{shown(stopped)} at {stopped_cell(source / stopped.name)}"
                                for stopped in [notebook, *running.values()]
                            )
                            failure = BuildError(
                                f"a chapter's process died (killed, or out of "
                                f"memory) while running {where}"
                            )
                    except Exception as error:
                        if failure is None:
                            failure = error
                            log(
                                f"{shown(notebook)} failed; the chapters still "
                                f"running finish, so that their results are cached"
                            )
        except KeyboardInterrupt:
            _stop_workers(pool)
            where = "; ".join(
                f"{shown(notebook)}, {stopped_cell(source / notebook.name)}"
                for notebook in running.values()
            )
            raise BuildInterrupted(
                f"interrupted during {where or 'the build'}; finished results are kept"
            ) from None
    if failure is not None:
        raise failure


@contextlib.contextmanager
def build_lock(build_dir, log):
    """Hold ``<build>/build.lock`` while building: a second build in the same folder waits for
    the first (both would rewrite ``source/`` and ``html/``), saying so in one line. Builds in
    different folders do not wait for each other, even when they share a result cache."""
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "build.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            log(f"another build is using {build_dir} ({holder}); waiting for it to finish ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()}")
        lock.flush()
        yield  # the lock goes with the file's closing, also when the process dies


def through_section(notebook, section, folder):
    """A copy of ``notebook`` in ``folder`` that stops after its section ``section`` (the cells
    before the heading ``## <section + 1>.``) and then saves its ledger (its last cell, which
    every chapter ends with). Returns the copy's path; a clear error if there is no such
    section."""
    chapter = nbformat.read(notebook, as_version=4)
    check_size("through", section)
    ends = [
        k
        for k, cell in enumerate(chapter.cells)
        if cell.cell_type == "markdown" and cell.source.startswith(f"## {section + 1}. ")
    ]
    if not ends:
        raise ValueError(f"{shown(notebook)} has no section {section + 1} to stop before")
    if "ledger.save()" not in chapter.cells[-1].source:
        raise ValueError(f"{shown(notebook)} does not end with ledger.save()")
    chapter.cells = chapter.cells[: ends[0]] + [chapter.cells[-1]]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(chapter, folder / notebook.name)
    return folder / notebook.name


def build(
    profile=None,
    build_dir=None,
    log=print,
    device=None,
    jobs=None,
    only=None,
    render=True,
    through=None,
):
    """Execute the chapters under ``profile`` on ``device`` and build ``<build>/html``; returns
    index.html. ``jobs``: processes computing, chapters and shards (default: one per core on
    the CPU, one on a GPU). ``only``: chapter names (see ``select_chapters``) to execute and
    record without rendering; returns None, as with ``render=False``. ``through``: with one
    chapter in ``only``, execute its sections 1 to ``through`` only, and in the paper profile
    record their rows as a partial record."""
    profile = resolve_profile(profile)
    device = str(devices.resolve(device))  # a bad device or a missing GPU stops here
    github = repository()
    notebooks = select_chapters(only)
    if through is not None and (not only or len(notebooks) != 1):
        raise ValueError("--through needs exactly one chapter named with --chapters")
    render = render and not only
    jobs = check_jobs(jobs, device)
    at_once = min(jobs, len(notebooks))
    build_dir = Path(build_dir or default_build_dir()).resolve()
    with build_lock(build_dir, log):
        source = build_dir / "source"
        if source.exists() and render:
            shutil.rmtree(source)
        (source / "chapters").mkdir(parents=True, exist_ok=True)
        for name in BOOK_FILES:
            shutil.copy2(REPO_ROOT / name, source / name)
        # the book's own style sheet, which Jupyter Book adds to every page from _static/
        shutil.copytree(REPO_ROOT / "_static", source / "_static", dirs_exist_ok=True)
        # the chapters show the models they train with {literalinclude} /toycore/models.py
        shutil.copytree(
            REPO_ROOT / "toycore",
            source / "toycore",
            ignore=shutil.ignore_patterns("__pycache__"),
            dirs_exist_ok=True,
        )
        set_repository(source / "_config.yml", github)
        if render:
            try:
                self_contained = offline.vendor(build_dir / "offline", log=log)
            except offline.AssetError as error:
                raise BuildError(str(error)) from None
            if self_contained:
                add_sphinx_config(
                    source / "_config.yml", offline.sphinx_settings(build_dir / "offline")
                )
        claims = build_dir / "claims"
        for notebook in notebooks:  # a ledger from an earlier build must not pass for this one
            (claims / f"{notebook.stem}.json").unlink(missing_ok=True)
        partial = None
        if through is not None:
            notebooks = [through_section(notebooks[0], through, build_dir / "partial")]
            partial = f"sections 1 to {through} of the chapter"

        def finished(notebook, seconds):
            if seconds is None:
                log(f"  {notebook.stem}: nothing it reads has changed; its last execution reused")
                return
            log(f"  {notebook.stem} done in {seconds:.0f} s")
            if profile == "paper":
                rows = load_ledgers(claims).get(notebook.stem)
                if not rows:
                    return
                given = records.provenance(notebook.stem, device, seconds, at_once)
                kept = records.recorded_before(notebook.stem, rows, given, partial=partial)
                if kept:  # every result came from the cache: the record's time is the real run's
                    log(f"  same results as the record of {kept['provenance']['recorded']}, kept")
                else:
                    path = records.write(notebook.stem, rows, given, partial=partial)
                    log(f"  recorded in {path.relative_to(REPO_ROOT)}")

        # The kernels papermill starts inherit these: the profile and device for code that reads
        # them, the build folder for the ledgers, and no progress bars in the saved pages.
        variables = dict(
            TOYCORE_PROFILE=profile,
            TOYCORE_DEVICE=device,
            TOYCORE_BUILD_DIR=str(build_dir),
            TOYCORE_PROGRESS="0",
        )
        execute_all(notebooks, source / "chapters", profile, device, jobs, variables, log, finished)

        ledgers = {
            stem: rows
            for stem, rows in load_ledgers(claims).items()
            if stem in {nb.stem for nb in notebooks}
        }
        missing = [nb.stem for nb in notebooks if nb.stem not in ledgers]
        if missing:
            raise BuildError(f"these chapters wrote no claims ledger: {', '.join(missing)}")
        if not render:
            log("executed the chapters; the HTML is rendered only by a build of every chapter")
            return None
        titles = {nb.stem: notebook_title(nb) for nb in notebooks}
        ledgers = {stem: ledgers[stem] for stem in titles}  # in the book's order
        recorded = records.load()
        codes = {stem: records.chapter_code(stem) for stem in recorded}
        intro = source / "intro.md"
        intro.write_text(
            intro.read_text()
            .replace(LEDGER_MARKER, ledger_summary(ledgers, titles))
            .replace(PAPER_MARKER, paper_comparison(ledgers, recorded, titles, codes))
        )
        anchors = {stem: row_anchors(source / "chapters" / f"{stem}.ipynb") for stem in titles}
        found = source / "findings.md"
        found.write_text(
            found.read_text().replace(
                FINDINGS_MARKER,
                findings(ledgers, load_corrections(claims), recorded, anchors),
            )
        )

        log("rendering the HTML ...")
        return render_html(source, build_dir)


def render_html(source, build_dir):
    """Sphinx renders the executed book in ``source`` into ``<build_dir>/html``, warnings as
    errors; returns index.html."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    subprocess.run(
        [str(jupyter_book), "config", "sphinx", str(source)], check=True, stdout=subprocess.DEVNULL
    )
    html_dir = build_dir / "html"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-b",
            "html",
            "-W",
            "--keep-going",
            "-q",
            "-d",
            str(build_dir / "doctrees"),
            str(source),
            str(html_dir),
        ]
    )
    if result.returncode != 0:
        raise BuildError("Sphinx reported warnings or errors (above); the book was not published")
    return html_dir / "index.html"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default=None, help=f"one of {', '.join(PROFILES)}")
    parser.add_argument(
        "--device",
        default=None,
        help="auto (default: the GPU when torch sees one), cpu, cuda or cuda:k",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes computing chapters and shards (default: one per core; 1 on a GPU)",
    )
    parser.add_argument(
        "--chapters",
        nargs="+",
        default=None,
        metavar="CHAPTER",
        help="execute (and record) only these, e.g. 05_persian_rug or 05; no HTML",
    )
    parser.add_argument(
        "--no-html", action="store_true", help="execute (and record) the chapters, render no HTML"
    )
    parser.add_argument(
        "--through",
        type=int,
        default=None,
        metavar="N",
        help="with one chapter: execute its sections 1 to N only (a partial paper record)",
    )
    parser.add_argument("--build-dir", default=None, help="default: _build at the repository root")
    args = parser.parse_args(argv)
    try:
        index = build(
            args.profile,
            args.build_dir,
            device=args.device,
            jobs=args.jobs,
            only=args.chapters,
            render=not args.no_html,
            through=args.through,
        )
    except (BuildError, ValueError) as error:
        print(f"book build failed: {error}", file=sys.stderr)
        return 1
    except BuildInterrupted as error:
        print(error, file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # outside the chapters: fetching assets, rendering
        print("interrupted; finished results are kept", file=sys.stderr)
        return 130
    if index is not None:
        print(f"The book is at {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
