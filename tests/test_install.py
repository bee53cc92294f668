"""toycore is an installable package: its wheel, installed with the [book] extra into a fresh
virtual environment, runs the book's command line and imports a chapter's experiments, and
finds the book when run in a clone of it (or a folder below), not elsewhere."""

import shutil
import subprocess
import sys

from toycore.paths import REPO_ROOT


def test_the_wheel_installs_with_its_book_extra_into_a_fresh_venv(tmp_path):
    # built from a copy of what the package is made of, so that no build folder lands in the
    # repository and nothing else of it can slip in
    source, wheels, venv = tmp_path / "source", tmp_path / "wheels", tmp_path / "venv"
    source.mkdir()
    shutil.copy2(REPO_ROOT / "pyproject.toml", source)
    shutil.copytree(
        REPO_ROOT / "toycore", source / "toycore", ignore=shutil.ignore_patterns("__pycache__")
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", wheels, source], check=True)
    (wheel,) = wheels.glob("toycore-*.whl")
    # the README's pins, as constraints (an unpinned torch would be PyPI's CUDA build)
    pins = [
        line
        for line in (REPO_ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "-e"))
    ]
    (tmp_path / "constraints.txt").write_text("\n".join(pins) + "\n")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",  # two short processes import from it: compiling all of it costs more
            "-c",
            tmp_path / "constraints.txt",
            f"{wheel}[book]",
        ],
        check=True,
    )
    # run outside the repository, so that only the installed toycore can be imported
    run = dict(cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    helped = subprocess.run([python, "-m", "toycore.book", "--help"], **run)
    assert helped.returncode == 0 and "--profile" in helped.stdout, helped.stderr
    imported = subprocess.run(
        [
            python,
            "-c",
            # dask.distributed: the build's local cluster of shard workers (--jobs > 1)
            "import pathlib, toycore, toycore.experiments.persian_rug, toycore.shards; "
            "import dask.distributed; "
            "script = pathlib.Path(toycore.__file__).parent / 'inpage.js'; "
            "print(toycore.__file__, script.is_file())",
        ],
        **run,
    )
    assert imported.returncode == 0, imported.stderr
    where, has_script = imported.stdout.split()
    assert where.startswith(str(venv)) and has_script == "True"
    # In the book's folder (here, a chapter's folder below it, as a chapter's kernel runs), the
    # installed toycore finds the book: it lists the clone's chapters. Elsewhere it says why not.
    in_clone = subprocess.run(
        [python, "-m", "toycore.book", "--chapters", "99"], **{**run, "cwd": REPO_ROOT / "chapters"}
    )
    assert "no chapter '99'; the chapters are 01_linear_autoencoders" in in_clone.stderr
    elsewhere = subprocess.run([python, "-m", "toycore.book", "--profile", "ci"], **run)
    assert elsewhere.returncode == 1 and "holds no _toc.yml" in elsewhere.stderr
