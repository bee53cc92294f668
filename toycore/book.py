"""Build the book: execute every chapter with papermill, then render the executed copies.

    python -m toycore.book --profile cpu        # what `make book` runs

1. The book's sources (_config.yml, _toc.yml, intro.md, references.bib) are copied to
   ``<build>/source``; each chapter in _toc.yml is executed by papermill with its ``profile``
   parameter into ``<build>/source/chapters/``. Committed notebooks are never written to.
2. Expensive results go through ``toycore.cache``, so re-executing with nothing changed is quick.
3. The chapters' claims ledgers (``<build>/claims/*.json``) are summarised into the intro page.
4. Sphinx renders ``<build>/source`` into ``<build>/html`` with execution off; the widget state
   papermill saved is embedded in the pages. Warnings are errors.
5. Before any of this, ``toycore.offline`` fetches pinned require.js, the ipywidgets HTML manager
   and MathJax from npm into ``<build>/offline``, and the pages load them from the book itself,
   so the HTML shows widgets and math with no network (or from CDNs, with a warning, without npm).
A failing cell stops the build, naming the chapter and the cell; no page with a traceback is
published.
"""
import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import papermill
import yaml
from nbclient.exceptions import CellTimeoutError
from papermill.exceptions import PapermillExecutionError

from . import offline
from .claims import load_ledgers
from .paths import REPO_ROOT, build_dir as default_build_dir
from .profiles import PROFILES, resolve_profile

BOOK_FILES = ("_config.yml", "_toc.yml", "intro.md", "references.bib")
LEDGER_MARKER = "<!-- claims-ledger -->"
LEDGER_ANCHOR = "claims-ledger"  # the id of each chapter's "## Claims ledger" heading
# The longest a single cell may run, per profile: a stuck or pathologically slow cell fails the
# build naming its chapter instead of silently using up CI's time. `paper` runs on a GPU, unbounded.
CELL_TIMEOUT_S = {"ci": 600, "cpu": 3600, "paper": None}


class BuildError(RuntimeError):
    pass


def chapters(root=REPO_ROOT):
    """The chapter notebooks listed in _toc.yml, in order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    entries = [entry["file"] for entry in toc.get("chapters", [])]
    return [root / f"{entry}.ipynb" for entry in entries]


def execute_chapter(notebook, output, profile):
    """Run one chapter with papermill; a failing or timed-out cell raises BuildError naming it."""
    timeout = CELL_TIMEOUT_S[resolve_profile(profile)]
    try:
        papermill.execute_notebook(str(notebook), str(output), parameters={"profile": profile},
                                   kernel_name="python3", cwd=str(notebook.parent),
                                   progress_bar=False, execution_timeout=timeout)
    except CellTimeoutError as error:
        raise BuildError(f"{os.path.relpath(notebook, REPO_ROOT)}: a cell ran past the {profile} "
                         f"profile's {timeout} s limit.\n{error}") from None
    except PapermillExecutionError as error:
        # papermill inserts a cell of injected parameters; number cells as the committed notebook does
        executed = nbformat.read(output, as_version=4)
        injected = [i for i, cell in enumerate(executed.cells)
                    if "injected-parameters" in cell.metadata.get("tags", [])]
        index = error.cell_index - (1 if injected and injected[0] < error.cell_index else 0)
        first_line = error.source.strip().splitlines()[0] if error.source.strip() else ""
        raise BuildError(
            f"{os.path.relpath(notebook, REPO_ROOT)}: cell {index} (counting from 0, "
            f"starting `{first_line}`) raised {error.ename}: {error.evalue}\n"
            f"The executed copy with the traceback is {output}") from None


def ledger_summary(ledgers, titles):
    """The intro page's table of every chapter's claims ledger, linking to each chapter's table."""
    lines = ["| chapter | profile | claims | reproduce | do not reproduce | ledger |",
             "|---|---|---|---|---|---|"]
    failing = []
    for stem, rows in ledgers.items():
        passed = sum(row["passed"] for row in rows)
        profiles = ", ".join(sorted({row["profile"] for row in rows}))
        page = f"chapters/{stem}.ipynb"
        lines.append(f"| [{titles.get(stem, stem)}]({page}) | `{profiles}` | {len(rows)} | {passed} "
                     f"| {len(rows) - passed} | [table]({page}#{LEDGER_ANCHOR}) |")
        failing += [f"- {titles.get(stem, stem)}: {row['claim']}"
                    + (" (explained in the chapter)" if row["known_failure"] else " (**unexpected**)")
                    for row in rows if not row["passed"]]
    if failing:
        lines += ["", "Claims that did not reproduce in this build:", ""] + failing
    return "\n".join(lines)


def notebook_title(notebook):
    """The first Markdown heading of a notebook."""
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return notebook.stem


def add_sphinx_config(config_file, settings):
    """Add settings to a _config.yml's ``sphinx.config`` (the build's copy, never the committed one)."""
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


def build(profile=None, build_dir=None, log=print):
    """Execute all chapters under ``profile`` and build ``<build>/html``; returns index.html."""
    profile = resolve_profile(profile)
    build_dir = Path(build_dir or default_build_dir()).resolve()
    source = build_dir / "source"
    if source.exists():
        shutil.rmtree(source)
    (source / "chapters").mkdir(parents=True)
    for name in BOOK_FILES:
        shutil.copy2(REPO_ROOT / name, source / name)
    try:
        self_contained = offline.vendor(build_dir / "offline", log=log)
    except offline.AssetError as error:
        raise BuildError(str(error)) from None
    if self_contained:
        add_sphinx_config(source / "_config.yml", offline.sphinx_settings(build_dir / "offline"))
    claims = build_dir / "claims"
    if claims.exists():
        shutil.rmtree(claims)  # a ledger from an earlier build must not pass for this one

    # The kernels papermill starts inherit these: the profile for code that reads it, the build
    # folder for the ledgers, and no progress bars in the saved pages.
    titles = {}
    with environment(TOYCORE_PROFILE=profile, TOYCORE_BUILD_DIR=str(build_dir),
                     TOYCORE_PROGRESS="0"):
        for notebook in chapters():
            start = time.perf_counter()
            log(f"executing {notebook.relative_to(REPO_ROOT)} (profile {profile}) ...")
            execute_chapter(notebook, source / "chapters" / notebook.name, profile)
            titles[notebook.stem] = notebook_title(notebook)
            log(f"  done in {time.perf_counter() - start:.0f} s")

    ledgers = load_ledgers(claims)
    missing = [stem for stem in titles if stem not in ledgers]
    if missing:
        raise BuildError(f"these chapters wrote no claims ledger: {', '.join(missing)}")
    intro = source / "intro.md"
    intro.write_text(intro.read_text().replace(LEDGER_MARKER, ledger_summary(ledgers, titles)))

    log("rendering the HTML ...")
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    subprocess.run([str(jupyter_book), "config", "sphinx", str(source)], check=True,
                   stdout=subprocess.DEVNULL)
    html = build_dir / "html"
    result = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going",
                             "-q", "-d", str(build_dir / "doctrees"), str(source), str(html)])
    if result.returncode != 0:
        raise BuildError("Sphinx reported warnings or errors (above); the book was not published")
    return html / "index.html"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default=None, help=f"one of {', '.join(PROFILES)}")
    parser.add_argument("--build-dir", default=None, help="default: _build at the repository root")
    args = parser.parse_args(argv)
    try:
        index = build(args.profile, args.build_dir)
    except (BuildError, ValueError) as error:
        print(f"book build failed: {error}", file=sys.stderr)
        return 1
    print(f"The book is at {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
