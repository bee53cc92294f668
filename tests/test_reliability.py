"""Faults and bad input: the result cache cannot lie (the code that runs, checksums, one
computation per result, pruning), every public function refuses out-of-range input before any
work, and a diverging run stops with an error. (The build's own failure reports are tested in
test_book_build.py.)

Each test that changes source files does so in a copy of the package, in a fresh interpreter,
as a reader editing toycore under a running kernel would."""

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from traitlets.config import Config

from toycore import cache, shards
from toycore.data import SparseUniform
from toycore.experiments import hidden_noise as ex_noise
from toycore.experiments import linear as ex_linear
from toycore.experiments import persian_rug as ex_rug
from toycore.experiments import polysemantic as ex_poly
from toycore.experiments import relu as ex_relu
from toycore.models import TiedBasisAutoencoder, ToyModel, UntiedAutoencoder
from toycore.theory import hidden_noise as th_noise
from toycore.theory import linear as th_linear
from toycore.theory import persian_rug as th_rug
from toycore.theory import polysemantic as th_poly
from toycore.theory import relu as th_relu
from toycore.train import train, train_until_converged

# A function to cache, in a module of its own, so that fresh interpreters can import it.
SLOW_MODULE = """
import os, time
from toycore.cache import cached

@cached
def slow_square(x):
    time.sleep(float(os.environ.get("SLOW_SECONDS", "0")))
    with open(os.environ["CALLS_LOG"], "a") as log:
        log.write(f"{x}\\n")
    return x * x
"""


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """A copy of toycore and a module with a cached function, with their own cache: (run(code)
    in a fresh interpreter -> its stdout and stderr, the copy's folder, the calls log)."""
    root = tmp_path / "copy"
    shutil.copytree(cache.PACKAGE, root / "toycore", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "slow.py").write_text(SLOW_MODULE)
    calls = tmp_path / "calls.log"
    environ = {
        **os.environ,
        "PYTHONPATH": str(root),
        "TOYCORE_CACHE": str(tmp_path / "cache"),
        "CALLS_LOG": str(calls),
    }

    def run(code):
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=root,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return result

    return run, root, calls


def calls_made(calls):
    return calls.read_text().split() if calls.exists() else []


def test_code_edited_after_import_stops_the_cache_for_what_it_changes_until_a_restart(
    package_copy,
):
    run, root, calls = package_copy
    slow = root / "slow.py"
    result = run(
        """
        import toycore, slow
        assert toycore.__file__.startswith(%r)
        print(slow.slow_square(3))
        with open(%r, "a") as source:  # a comment changes no number: the cache goes on
            source.write("\\n# edited while this process runs\\n")
        print(slow.slow_square(4))
        with open(%r) as source:
            text = source.read()
        with open(%r, "w") as source:  # the function's own code: refused until a restart
            source.write(text.replace("return x * x", "return x * x * 1"))
        slow.slow_square(5)
    """
        % (str(root), str(root / "toycore" / "data.py"), str(slow), str(slow))
    )
    assert result.stdout.split() == ["9", "16"]
    assert (
        "RuntimeError: the code that slow.slow_square runs has changed since this process "
        "imported toycore (slow.slow_square): restart it"
    ) in result.stderr
    assert calls_made(calls) == ["3", "4"]  # nothing was computed, or stored, with the edit
    # A fresh process runs the code on disk: a new key, so 3 is computed again, by that code.
    again = run("import slow; print(slow.slow_square(3))")
    assert again.returncode == 0 and again.stdout.split() == ["9"], again.stderr
    assert calls_made(calls) == ["3", "4", "3"]


def test_the_key_reads_the_packages_modules_and_no_stray_file(package_copy):
    run, root, _ = package_copy
    key = (
        "from toycore import cache; from toycore.experiments import linear; "
        "print(cache.code_key(linear.train_to_minimum.uncached))"
    )
    before = run(key).stdout
    (root / "toycore" / "scratch.py").write_text("x = 1\n")  # a module nothing uses
    (root / "toycore" / "experiments" / ".#linear.py").symlink_to("nowhere@1234")  # an editor's
    after = run(key)
    assert after.returncode == 0, after.stderr
    assert after.stdout == before


def damage_the_stored_49(cache_dir):
    """Alter the one stored result, 49, to 50, keeping it a valid pickle: unchecked, it would
    be served."""
    [stored] = cache_dir.rglob("*.pkl")
    checksum, payload = stored.read_bytes().split(b"\n", 1)
    altered = payload.replace(bytes([49]), bytes([50]))
    assert altered != payload and pickle.loads(altered) == 50
    stored.write_bytes(checksum + b"\n" + altered)
    return stored


def test_a_damaged_result_is_computed_again_saying_so_in_one_line(package_copy, tmp_path):
    run, _, calls = package_copy
    assert run("import slow; print(slow.slow_square(7))").stdout.split() == ["49"]
    stored = damage_the_stored_49(tmp_path / "cache")
    result = run("import slow; print(slow.slow_square(7))")
    assert result.stdout.split() == ["49"] and calls_made(calls) == ["7", "7"]
    assert result.stderr.strip().splitlines() == [
        f"toycore.cache: {stored} is damaged (its checksum does not match); computing it again"
    ]
    # And the result stored anew is whole again.
    assert run("import slow; print(slow.slow_square(7))").stdout.split() == ["49"]
    assert calls_made(calls) == ["7", "7"]


def test_in_a_kernel_that_line_goes_to_the_log_and_never_into_the_page(
    package_copy, tmp_path, monkeypatch, capfd
):
    import nbformat
    import papermill

    run, root, calls = package_copy
    run("import slow; slow.slow_square(7)")
    stored = damage_the_stored_49(tmp_path / "cache")
    for name, value in (
        ("PYTHONPATH", root),
        ("TOYCORE_CACHE", tmp_path / "cache"),
        ("CALLS_LOG", calls),
    ):
        monkeypatch.setenv(name, str(value))  # the kernel inherits them
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import slow\nprint(slow.slow_square(7))")]
    )
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(notebook, tmp_path / "chapter.ipynb")
    capfd.readouterr()
    # Unix sockets, as the book build's kernels use: a TCP port the manager picks can be taken
    # before the kernel binds it. A short folder: a socket's path has ~100 bytes.
    sockets = Path(tempfile.mkdtemp(prefix="tk-"))
    papermill.execute_notebook(
        str(tmp_path / "chapter.ipynb"),
        str(tmp_path / "executed.ipynb"),
        kernel_name="python3",
        progress_bar=False,
        config=Config(KernelManager=dict(transport="ipc", ip=str(sockets / "kernel"))),
    )
    shutil.rmtree(sockets, ignore_errors=True)
    [cell] = nbformat.read(tmp_path / "executed.ipynb", as_version=4).cells
    assert [(output.name, output.text) for output in cell.outputs] == [("stdout", "49\n")]
    assert f"toycore.cache: {stored} is damaged" in capfd.readouterr().err
    assert calls_made(calls) == ["7", "7"]


def test_two_processes_sharing_the_cache_compute_a_result_once(package_copy):
    run, root, calls = package_copy
    code = "import slow; print(slow.slow_square(5))"
    environ = {
        **os.environ,
        "PYTHONPATH": str(root),
        "SLOW_SECONDS": "3",
        "TOYCORE_CACHE": str(root.parent / "cache"),
        "CALLS_LOG": str(calls),
    }
    first, second = (
        subprocess.Popen(
            [sys.executable, "-c", code], env=environ, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    )
    assert [p.communicate(timeout=120)[0].split() for p in (first, second)] == [["25"], ["25"]]
    assert calls_made(calls) == ["5"]


def test_pruning_removes_only_folders_no_current_code_uses(tmp_path):
    current = cache.cache_key(ex_linear.train_to_minimum.uncached, "cpu")
    old = "0123456789abcdef" + current[16:]
    upgraded = current.replace("torch", "torch0.1-was")
    for name in (current, old, upgraded, cache.EXECUTED):
        (tmp_path / name / "results").mkdir(parents=True)
    assert sorted(cache.prune(tmp_path)) == sorted([old, upgraded])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([current, cache.EXECUTED])


def test_a_result_is_stored_whole_or_not_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))

    def interrupted(source, target):
        raise OSError("disk full")  # the write did not complete

    monkeypatch.setattr(cache.os, "replace", interrupted)
    with pytest.raises(OSError, match="disk full"):
        cache.call(abs, (-2,))
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".lock"]  # no part left


# --- inputs are checked before any work --------------------------------------------------------

BAD_INPUTS = {  # call -> the start of the error it must raise
    "variance_bound p < 0": (
        lambda: th_rug.variance_bound(-0.5, 0.5),
        r"p must be finite and in \(0, 1\]",
    ),
    "variance_bound ratio 0": (
        lambda: th_rug.variance_bound(0.1, 0),
        r"the ratio nd/ns must be finite and in \(0, 1\]",
    ),
    "population_second_moment": (
        lambda: th_linear.population_second_moment(4, 1.5),
        r"sparsity must be finite and in \[0, 1\]",
    ),
    "pattern_weights": (
        lambda: th_relu.pattern_weights(4, 1.5),
        r"sparsity must be a number or a list of numbers in \[0, 1\]",
    ),
    "linear_optimum NaN importance": (
        lambda: th_relu.linear_optimum([1.0, np.nan, 1.0], 1, 0.5),
        "importance must be finite and > 0",
    ),
    "linear_optimum negative hidden": (
        lambda: th_relu.linear_optimum([1.0, 1.0, 1.0], -1, 0.5),
        r"hidden must be an integer in \[1, 3\]",
    ),
    "macroscopic_loss sigma -1": (
        lambda: th_rug.macroscopic_loss(1.0, 0.0, -1.0, 0.1),
        "sigma must be finite and > 0",
    ),
    "macroscopic_loss sigma 0": (
        lambda: th_rug.macroscopic_loss(1.0, 0.0, 0.0, 0.1),
        "sigma must be finite and > 0",
    ),
    "noisy_squared_norm": (
        lambda: th_noise.noisy_squared_norm(-1),
        "sigma must be finite and >= 0",
    ),
    "index_sets hidden > features": (
        lambda: th_linear.index_sets(3, 5),
        r"hidden must be an integer in \[1, 3\]",
    ),
    "expected_polysemantic": (
        lambda: th_poly.expected_polysemantic(8, 4),
        "hidden must be >= features",
    ),
    "sparsification_law": (
        lambda: th_poly.sparsification_law(1.0, 8, -0.1),
        "l1 must be finite and >= 0",
    ),
    "grid_runs density 1.5": (
        lambda: ex_rug.grid_runs([8], [1.5], [0.5], [0], steps=2),
        r"p must be finite and in \(0, 1\]; got 1.5",
    ),
    "grid_runs density 0": (
        lambda: ex_rug.grid_runs([8], [0], [0.5], [0], steps=2),
        r"p must be finite and in \(0, 1\]; got 0",
    ),
    "size_sweep density 1.5": (
        lambda: ex_rug.size_sweep([8], 1.5, 0.5, [0], max_steps=2),
        r"p must be finite and in \(0, 1\]; got 1.5",
    ),
    "polysemantic_sweep l1 < 0": (
        lambda: ex_poly.polysemantic_sweep(4, [8], [0], -1.0, steps=2, lr=0.1),
        "l1 must be finite and >= 0",
    ),
    "strength_sweep sigma < 0": (
        lambda: ex_noise.strength_sweep(4, 8, [0.1], [-1.0], [0], steps=2, lr=0.1),
        "sigmas must be finite and >= 0",
    ),
    "train_sweep sparsity 1.5": (
        lambda: ex_relu.train_sweep.uncached(5, 2, [1.5], [0], decay=1.0, steps=2, lr=0.1),
        "sparsity must be",
    ),
    "data with the wrong feature count": (
        lambda: ToyModel(5, 2, [0]).loss(torch.rand(1, 3, 4)),
        r"inputs must have shape \(instances=1, batch, features=5\); got \(1, 3, 4\)",
    ),
    "init_std inf": (
        lambda: ToyModel(5, 2, [0], init_std=float("inf")),
        "init_std must be finite and > 0",
    ),
    "lr inf": (
        lambda: train(ToyModel(5, 2, [0]), torch.rand(1, 3, 5), steps=5, lr=float("inf")),
        "lr must be finite and > 0",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_raises_a_clear_error_before_any_work(case, monkeypatch):
    call, message = BAD_INPUTS[case]

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    monkeypatch.setattr(shards, "run", no_work)
    monkeypatch.setattr(ex_relu, "train", no_work)
    with pytest.raises(ValueError, match=message):
        call()


def test_sizes_may_be_numpy_integers():
    assert th_rug.hadamard(np.int64(8)).shape == (8, 8)
    assert ToyModel(np.int64(5), np.int64(2), [np.int64(3)]).seeds == (3,)


# --- a diverging run stops -------------------------------------------------------------------


def test_a_run_whose_loss_stops_being_finite_raises_naming_instance_and_step():
    x = torch.rand(2, 16, 5)
    with pytest.raises(
        FloatingPointError,
        match=r"instance 0 \(seed 0\) .* not finite at step 1 "
        r"\(finite at step 0\); ToyModel, lr=1e\+30",
    ):
        train(ToyModel(5, 2, [0, 1]), x, steps=50, lr=1e30, desc=None)
    x[1, 3, 2] = float("inf")  # only the second instance's data is bad
    with pytest.raises(FloatingPointError, match=r"instance 1 \(seed 7\) .* not finite at step 0;"):
        train(ToyModel(5, 2, [0, 7]), x, steps=50, lr=0.01, desc=None)


def test_the_closed_form_model_and_the_stopping_rule_trainer_stop_too():
    with pytest.raises(FloatingPointError, match="instance 0 .* TiedBasisAutoencoder"):
        train(TiedBasisAutoencoder(4, 8, [0], l1=0.1), None, steps=200, lr=1e20, desc=None)
    model = UntiedAutoencoder(8, 2, [0, 1])
    with pytest.raises(
        FloatingPointError,
        match=r"instance 1 \(seed 1\) .* UntiedAutoencoder, "
        r"lr=1e\+30, batch=8",
    ):
        train_until_converged(
            model, SparseUniform([0, 1], 8, 0.5), lr=[1e-3, 1e30], batch=8, steps=60, desc=None
        )
