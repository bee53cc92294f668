"""Committed chapter notebooks carry no outputs, execution counts or widget state, and speak only
of what a reader can see."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

from toycore.book.config import chapters

NOTEBOOKS = sorted(Path(__file__).resolve().parent.parent.glob("chapters/*.ipynb"))


def test_every_toc_chapter_exists_and_every_notebook_is_in_the_toc():
    listed = chapters()
    assert listed and all(p.exists() for p in listed)
    assert sorted(listed) == NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_a_profile_parameter_and_a_ledger(path):
    nb = nbformat.read(path, as_version=4)
    parameters = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1 and "profile = None" in parameters[0].source
    assert "ledger.save()" in nb.cells[-1].source


# What a reader cannot see: the project's own design notes and issue tracker.
INTERNAL = re.compile(
    r"DESIGN|design (?:doc|note)|\bissues? ?#?\d|\.\./shared|seeds/|\blease|farm-bench", re.I
)


@pytest.mark.parametrize(
    "path",
    [
        *NOTEBOOKS,
        *(
            NOTEBOOKS[0].parent.parent / page
            for page in ("intro.md", "findings.md", "reproducing.md")
        ),
    ],
    ids=lambda p: p.name,
)
def test_the_book_cites_only_what_readers_can_see(path):
    if path.suffix == ".md":
        texts = [path.read_text()]
    else:
        texts = [cell.source for cell in nbformat.read(path, as_version=4).cells]
    for text in texts:
        assert not INTERNAL.search(text), f"{path.name}: {INTERNAL.search(text).group(0)!r}"


def _calls(statements):
    """The functions called in ``statements``, and "defines" for an import or a def."""
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                yield node.func
            elif isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef)):
                yield "defines"


def _keeps_books(statements):
    """Whether ``statements`` make ledger rows, show the ledger or its paper record, or hand
    numbers to the prose (glue)."""
    return any(
        (isinstance(f, ast.Name) and f.id == "glue")
        or (isinstance(f, ast.Attribute) and getattr(f.value, "id", None) in ("ledger", "records"))
        for f in _calls(statements)
        if f != "defines" and getattr(f, "attr", None) != "save"
    )


def _shows(statements):
    """Whether ``statements`` show a figure or a widget, or define what a reader should see."""
    return any(
        f == "defines"
        or (isinstance(f, ast.Name) and f.id == "show")
        or (isinstance(f, ast.Attribute) and getattr(f.value, "id", None) == "widgets")
        for f in _calls(statements)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_bookkeeping_cells_are_collapsed(path):
    """A page reads figure, table, prose: a cell that only checks and records (ledger rows, glue)
    shows its output with its code behind a toggle, and a cell that shows a figure ends there
    rather than going on to the ledger's rows."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
            continue
        body = ast.parse(cell.source).body
        hidden = "hide-input" in cell.metadata.get("tags", [])
        if _keeps_books(body) and not _shows(body):
            assert hidden, f"{path.name}, cell {cell.id}: only ledger rows or glue, not hide-input"
            continue
        assert not hidden, f"{path.name}, cell {cell.id}: shows something, but hides its code"
        shown = [k for k, statement in enumerate(body) if _shows([statement])]
        if shown:
            assert not _keeps_books(body[shown[-1] + 1 :]), (
                f"{path.name}, cell {cell.id}: ledger rows after its figure belong in a cell "
                "of their own (hide-input)"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_shows_a_ledger_row_as_its_value(path):
    """A ledger's forms return the row they add, which a cell ending in one would print as a
    raw dict; a trailing semicolon keeps it off the page (and is not in the statement's syntax
    tree, so no record's key moves with it)."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        body = ast.parse(cell.source).body
        last = body[-1] if body else None
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
            name = ast.unparse(last.value.func)
            assert not name.startswith("ledger.") or cell.source.rstrip().endswith(";"), (
                f"{path.name}, cell {cell.id}: ends in {name}(...), whose row the page would show"
            )
