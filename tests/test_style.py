"""One style everywhere: ruff (pinned in requirements.txt, configured in pyproject.toml) formats
and lints toycore, the tests and the benchmarks (lines of at most 100 characters) and the
chapters' code cells (at most 79, chapters/ruff.toml: what a code cell in the HTML shows whole
in a window 1366 CSS pixels wide or more)."""

import subprocess
import sys

import pytest

from toycore.paths import REPO_ROOT

TARGETS = ["toycore", "tests", "benchmarks", "chapters"]


def ruff(*args):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *TARGETS],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )


def test_the_code_is_formatted():
    result = ruff("format", "--check", "--diff")
    assert result.returncode == 0, f"run `ruff format`:\n{result.stdout}{result.stderr}"


def test_the_code_passes_the_linter():
    result = ruff("check", "--output-format", "concise")
    assert result.returncode == 0, f"run `ruff check --fix`:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize(
    "script", sorted((REPO_ROOT / "benchmarks").glob("*.py")), ids=lambda path: path.name
)
def test_every_benchmark_starts(script):
    # not part of the tests' timing, but a benchmark whose imports broke would go unnoticed
    result = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
