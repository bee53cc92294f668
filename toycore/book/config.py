"""The book's sources and settings: which chapters _toc.yml lists, their titles, the parts of a
chapter a partial run executes, and the build copy's _config.yml (repository, Binder, Sphinx)."""

import os
import re

import nbformat
import yaml

from ..dependencies import cells_for
from ..paths import REPO_ROOT, TOC

BOOK_FOLDERS = ("_static", "_ext")  # the style sheet; the extension that loads MathJax everywhere
BOOK_FILES = (
    "_config.yml",
    "_toc.yml",
    "intro.md",
    "findings.md",
    "reproducing.md",
    "references.bib",
)
REPOSITORY_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}")
BINDERHUB_URL = "https://mybinder.org"


def chapters(root=REPO_ROOT):
    """The chapter notebooks listed in _toc.yml, in order (its other pages are Markdown); a
    clear error where there is no book (toycore installed, run outside a clone)."""
    if not (root / TOC).is_file():
        raise ValueError(
            f"{root} holds no {TOC}: run the book's commands in a clone of the book (or a "
            f"folder below it)"
        )
    toc = yaml.safe_load((root / TOC).read_text())
    entries = [e["file"] for e in toc.get("chapters", []) if e["file"].startswith("chapters/")]
    return [root / f"{entry}.ipynb" for entry in entries]


def shown(notebook):
    """A notebook's path as messages give it: from the repository's root."""
    return os.path.relpath(notebook, REPO_ROOT)


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


def chapter_part(notebook, sections, folder):
    """A copy of ``notebook`` in ``folder`` that runs only its ``sections`` (a list of numbers),
    with the statements of the others that they need, and saves its ledger
    (``toycore.dependencies.cells_for``, which also says what the part's record depends on).
    Returns the copy's path; a clear error if the chapter has no such section."""
    chapter = nbformat.read(notebook, as_version=4)
    try:
        chapter.cells = [nbformat.from_dict(cell) for cell in cells_for(chapter.cells, sections)]
    except ValueError as error:
        raise ValueError(f"{shown(notebook)}: {error}") from None
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(chapter, folder / notebook.name)
    return folder / notebook.name
