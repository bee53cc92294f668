"""The result cache cannot lie: the code that runs, checksums, one computation per result, pruning.

Each test that changes source files does so in a copy of the package, in a fresh interpreter,
as a reader editing toycore under a running kernel would."""
import os
import shutil
import subprocess
import sys
import pickle
import textwrap

import pytest

from toycore import cache

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
    environ = {**os.environ, "PYTHONPATH": str(root), "TOYCORE_CACHE": str(tmp_path / "cache"),
               "CALLS_LOG": str(calls)}

    def run(code):
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=root,
                                env=environ, capture_output=True, text=True,
                                timeout=120)
        return result

    return run, root, calls


def calls_made(calls):
    return calls.read_text().split() if calls.exists() else []


def test_a_file_edited_after_import_stops_the_cache_until_the_process_restarts(package_copy):
    run, root, calls = package_copy
    result = run("""
        import toycore, slow
        assert toycore.__file__.startswith(%r)
        print(slow.slow_square(3))
        with open(%r, "a") as source:
            source.write("\\n# edited while this process runs\\n")
        slow.slow_square(4)
    """ % (str(root), str(root / "toycore" / "data.py")))
    assert result.stdout.split() == ["9"]
    assert ("RuntimeError: toycore/data.py has changed since this process imported toycore: "
            "restart it") in result.stderr
    assert calls_made(calls) == ["3"]  # nothing was computed, or stored, with the edited code
    # A fresh process runs the code on disk: a new key, so 3 is computed again, by that code.
    again = run("import slow; print(slow.slow_square(3))")
    assert again.returncode == 0 and again.stdout.split() == ["9"], again.stderr
    assert calls_made(calls) == ["3", "3"]


def test_the_key_covers_the_packages_modules_and_no_stray_file(package_copy):
    run, root, _ = package_copy
    before = run("from toycore import cache; print(cache.code_hash())").stdout
    (root / "toycore" / "scratch.py").write_text("x = 1\n")  # not a module of the package
    (root / "toycore" / "experiments" / ".#linear.py").symlink_to("nowhere@1234")  # an editor's
    after = run("from toycore import cache; print(cache.code_hash())")
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
        f"toycore.cache: {stored} is damaged (its checksum does not match); computing it again"]
    # And the result stored anew is whole again.
    assert run("import slow; print(slow.slow_square(7))").stdout.split() == ["49"]
    assert calls_made(calls) == ["7", "7"]


def test_in_a_kernel_that_line_goes_to_the_log_and_never_into_the_page(
        package_copy, tmp_path, monkeypatch, capfd):
    import nbformat
    import papermill

    run, root, calls = package_copy
    run("import slow; slow.slow_square(7)")
    stored = damage_the_stored_49(tmp_path / "cache")
    for name, value in (("PYTHONPATH", root), ("TOYCORE_CACHE", tmp_path / "cache"),
                        ("CALLS_LOG", calls)):
        monkeypatch.setenv(name, str(value))  # the kernel inherits them
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import slow\nprint(slow.slow_square(7))")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, tmp_path / "chapter.ipynb")
    capfd.readouterr()
    papermill.execute_notebook(str(tmp_path / "chapter.ipynb"), str(tmp_path / "executed.ipynb"),
                               kernel_name="python3", progress_bar=False)
    [cell] = nbformat.read(tmp_path / "executed.ipynb", as_version=4).cells
    assert [(output.name, output.text) for output in cell.outputs] == [("stdout", "49\n")]
    assert f"toycore.cache: {stored} is damaged" in capfd.readouterr().err
    assert calls_made(calls) == ["7", "7"]


def test_two_processes_sharing_the_cache_compute_a_result_once(package_copy):
    run, root, calls = package_copy
    code = "import slow; print(slow.slow_square(5))"
    environ = {**os.environ, "PYTHONPATH": str(root), "SLOW_SECONDS": "3",
               "TOYCORE_CACHE": str(root.parent / "cache"), "CALLS_LOG": str(calls)}
    first, second = (subprocess.Popen([sys.executable, "-c", code], env=environ,
                                      stdout=subprocess.PIPE, text=True) for _ in range(2))
    assert [p.communicate(timeout=120)[0].split() for p in (first, second)] == [["25"], ["25"]]
    assert calls_made(calls) == ["5"]


def test_pruning_removes_only_folders_no_current_code_uses(tmp_path):
    current = cache.cache_key("toycore.experiments.linear", "cpu")
    old = "0123456789abcdef" + current[16:]
    upgraded = current.replace("torch", "torch0.1-was")
    for name in (current, old, upgraded):
        (tmp_path / name / "results").mkdir(parents=True)
    assert sorted(cache.prune(tmp_path)) == sorted([old, upgraded])
    assert [p.name for p in tmp_path.iterdir()] == [current]


def test_a_result_is_stored_whole_or_not_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))

    def interrupted(source, target):
        raise OSError("disk full")  # the write did not complete

    monkeypatch.setattr(cache.os, "replace", interrupted)
    with pytest.raises(OSError, match="disk full"):
        cache.call(abs, (-2,))
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".lock"]  # no part left
