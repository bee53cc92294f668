"""Build the book: execute every chapter with papermill, then render the executed copies.

    python -m toycore.book --profile cpu        # what `make book` runs (``__main__.py``)

1. The book's sources (_config.yml, _toc.yml, the pages intro.md, findings.md and
   reproducing.md, references.bib, _static/) are copied to ``<build>/source``, and toycore's
   modules beside them, which the chapters quote with ``{literalinclude} /toycore/<module>.py``;
   the chapters are those _toc.yml lists (``config.py``, which also edits the build copy's
   _config.yml).
2. Each chapter is executed by papermill with its ``profile`` and ``device`` parameters into
   ``<build>/source/chapters/`` (``execute.py``). Committed notebooks are never written to.
   Chapters run side by side in worker processes (``--jobs``, default one per core on the CPU,
   one on a GPU), the longest of the last build first, and their sweeps' shards on a local Dask
   cluster of as many workers; the workers, and the chapters running at once, each have an equal
   share of the cores as torch threads (one each on two cores: two processes with one thread
   each do not slow each other there, with two threads each they did, 3.5x); a chapter executing
   alone computes its own cells on every core. Expensive results go through ``toycore.cache``,
   and a chapter's executed copy is kept there too, so that a chapter none of whose inputs
   changed is not executed again.
3. The chapters' claims ledgers (``<build>/claims/*.json``) are summarised into the intro page,
   beside the paper profile's recorded verdicts (``toycore.records``), and make the findings
   page (``reports.py``); a ``paper`` build records each chapter's ledger with its provenance
   and what it depends on in ``results/paper/`` (``build`` below).
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

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .. import devices, offline, records
from ..cache import PACKAGE, earlier_results
from ..claims import load_corrections, load_ledgers
from ..dependencies import Code, changes, parse_sections
from ..paths import REPO_ROOT
from ..paths import build_dir as default_build_dir
from ..profiles import resolve_profile
from .config import (
    BOOK_FILES,
    BOOK_FOLDERS,
    add_sphinx_config,
    chapter_part,
    notebook_title,
    repository,
    select_chapters,
    set_repository,
    shown,
)
from .execute import BuildError, cache_reads_file, check_jobs, execute_all
from .reports import (
    FINDINGS_MARKER,
    LEDGER_MARKER,
    PAPER_MARKER,
    findings,
    ledger_summary,
    paper_comparison,
    row_anchors,
)


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


def build(
    profile=None,
    build_dir=None,
    log=print,
    device=None,
    jobs=None,
    only=None,
    render=True,
    sections=None,
    records_folder=None,
):
    """Execute the chapters under ``profile`` on ``device`` and build ``<build>/html``; returns
    index.html. ``jobs``: processes computing, chapters and shards (default: one per core on
    the CPU, one on a GPU). ``only``: chapter names (see ``select_chapters``) to execute and
    record without rendering; returns None, as with ``render=False``. ``sections``: with one
    chapter in ``only``, execute only those of its sections (a list of numbers, or text such as
    "1-3,5"), with what they need of the others, and in the paper profile record their rows as
    a part of its record. ``records_folder``: where to record the chapters' ledgers (default:
    ``results/paper`` in the paper profile; another profile records only where this names, as
    the tests of a budgeted run do)."""
    profile = resolve_profile(profile)
    device = str(devices.resolve(device))  # a bad device or a missing GPU stops here
    github = repository()
    notebooks = select_chapters(only)
    if sections is not None:
        if not only or len(notebooks) != 1:
            raise ValueError("--sections needs exactly one chapter named with --chapters")
        sections = parse_sections(sections) if isinstance(sections, str) else sorted(sections)
    render = render and not only
    if records_folder is None and profile == "paper":
        records_folder = records.FOLDER
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
        # the book's own style sheet, which Jupyter Book adds to every page, and its own
        # Sphinx extension
        for folder in BOOK_FOLDERS:
            shutil.copytree(REPO_ROOT / folder, source / folder, dirs_exist_ok=True)
        # the chapters show the models they train with {literalinclude} /toycore/models.py
        shutil.copytree(
            PACKAGE,  # the toycore that runs: a clone's, or one installed from it
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
        if sections is not None:
            notebooks = [chapter_part(notebooks[0], sections, build_dir / "partial")]
        # What each record will depend on, read before its chapter runs: a record is written
        # only if that is still the code on disk when the chapter ends.
        if records_folder is not None:
            before = {nb.stem: _dependencies(nb.stem, sections, profile) for nb in notebooks}

        def finished(notebook, seconds):
            if seconds is None:
                log(f"  {notebook.stem}: nothing it reads has changed; its last execution reused")
                return
            log(f"  {notebook.stem} done in {seconds:.0f} s")
            if records_folder is not None:
                rows = load_ledgers(claims).get(notebook.stem)
                if not rows:
                    return
                now = _dependencies(notebook.stem, sections, profile)
                if now.key != before[notebook.stem].key:
                    raise BuildError(
                        f"{notebook.stem} was not recorded: the code it depends on changed "
                        f"while it ran ({', '.join(changes(before[notebook.stem], now))})"
                    )
                read = earlier_results(cache_reads_file(build_dir, notebook.stem))
                given = records.provenance(
                    notebook.stem, device, seconds, at_once, now.key, from_cache=read
                )
                # one part per section, each with what its own section depends on
                parts = records.section_parts(
                    notebook.stem, rows, given, sections, Code.from_folder(PACKAGE)
                )
                # a part the record already holds keeps the date and time of the run that
                # computed it (its results came from the cache)
                changed = records.new_parts(notebook.stem, parts, records_folder)
                if not changed:
                    log("  same results as the record already holds, kept")
                else:
                    path = records.write_parts(notebook.stem, changed, records_folder)
                    kept = len(parts) - len(changed)
                    log(
                        f"  recorded in {shown(path)}, {len(changed)} section(s)"
                        + (f"; {kept} the record already held as they are, kept" if kept else "")
                    )

        # The kernels papermill starts inherit these: the profile and device for code that reads
        # them, the build folder for the ledgers, and no progress bars in the saved pages.
        variables = dict(
            TOYCORE_PROFILE=profile,
            TOYCORE_DEVICE=device,
            TOYCORE_BUILD_DIR=str(build_dir),
            TOYCORE_PROGRESS="0",
        )
        execute_all(
            notebooks,
            source / "chapters",
            profile,
            device,
            jobs,
            variables,
            log,
            finished,
            recorded=records_folder is not None,
        )

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
        stale = records.stale_parts(recorded)
        intro = source / "intro.md"
        intro.write_text(
            intro.read_text()
            .replace(LEDGER_MARKER, ledger_summary(ledgers, titles))
            .replace(PAPER_MARKER, paper_comparison(ledgers, recorded, titles, stale))
        )
        anchors = {stem: row_anchors(source / "chapters" / f"{stem}.ipynb") for stem in titles}
        found = source / "findings.md"
        found.write_text(
            found.read_text().replace(
                FINDINGS_MARKER,
                findings(ledgers, load_corrections(claims), recorded, anchors, stale),
            )
        )

        log("rendering the HTML ...")
        return render_html(source, build_dir)


def _dependencies(chapter, sections, profile):
    """What a record of ``chapter`` would depend on with the code on disk now."""
    return records.chapter_dependencies(
        chapter, sections, Code.from_folder(PACKAGE), profile=profile
    )


def render_html(source, build_dir):
    """Sphinx renders the executed book in ``source`` into ``<build_dir>/html``, warnings as
    errors, with the book's own extensions (``source/_ext``) importable; returns index.html."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    path = os.pathsep.join(filter(None, [str(source / "_ext"), os.environ.get("PYTHONPATH")]))
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
        ],
        env={**os.environ, "PYTHONPATH": path},
    )
    if result.returncode != 0:
        raise BuildError("Sphinx reported warnings or errors (above); the book was not published")
    return html_dir / "index.html"
