"""Committed chapter notebooks carry no outputs, execution counts or widget state, and speak only
of what a reader can see."""

import re
from pathlib import Path

import nbformat
import pytest

from toycore.book import chapters

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
INTERNAL = re.compile(r"DESIGN|design (?:doc|note)|\bissues? ?#?\d|\.\./shared|seeds/", re.I)


@pytest.mark.parametrize(
    "path", [*NOTEBOOKS, NOTEBOOKS[0].parent.parent / "intro.md"], ids=lambda p: p.name
)
def test_the_book_cites_only_what_readers_can_see(path):
    if path.suffix == ".md":
        texts = [path.read_text()]
    else:
        texts = [cell.source for cell in nbformat.read(path, as_version=4).cells]
    for text in texts:
        assert not INTERNAL.search(text), f"{path.name}: {INTERNAL.search(text).group(0)!r}"
