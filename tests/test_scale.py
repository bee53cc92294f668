"""Scale: the device switch, the cache key, shards on a Dask cluster, resumable sweeps, parallel
chapters and the paper profile's records. None of it needs a GPU."""

import hashlib
import json
import os
import pickle
import runpy
import signal
import subprocess
import sys
import textwrap
import time

import nbformat
import numpy as np
import pytest
import torch

from toycore import book, cache, devices, records, shards
from toycore.book import config, execute, reports
from toycore.claims import Ledger
from toycore.data import SparseUniform
from toycore.dependencies import Dependencies
from toycore.experiments import persian_rug as rug
from toycore.experiments import polysemantic as poly
from toycore.experiments import rug_training
from toycore.models import TiedBasisAutoencoder, ToyModel, UntiedAutoencoder
from toycore.paths import REPO_ROOT

NO_GPU = not torch.cuda.is_available()


@pytest.fixture
def fresh_device(monkeypatch):
    """Forget the device chosen so far in this process, so the environment is read again."""
    monkeypatch.setattr(devices, "_current", None)


# --- the device ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "CPU ", "cuda0", "tpu", "mps"])
def test_an_unknown_device_is_refused(value, monkeypatch, fresh_device):
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:k"):
        devices.resolve(value)
    monkeypatch.setenv("TOYCORE_DEVICE", value)
    with pytest.raises(ValueError, match="device must be"):
        devices.current()


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_before_any_work(tmp_path, fresh_device):
    for value in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match="sees no GPU"):
            devices.use(value)
    assert devices.resolve("auto").type == "cpu"
    with pytest.raises(ValueError, match="sees no GPU"):
        book.build("ci", tmp_path, device="cuda")
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing fetched
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "toycore.book",
            "--profile",
            "ci",
            "--device",
            "cuda",
            "--build-dir",
            str(tmp_path / "cli"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "sees no GPU" in result.stderr
    assert not (tmp_path / "cli").exists()


def test_everything_honours_TOYCORE_DEVICE_cpu(monkeypatch, fresh_device):
    monkeypatch.setenv("TOYCORE_DEVICE", "cpu")
    assert devices.current() == torch.device("cpu")
    models = [
        TiedBasisAutoencoder(4, 6, [0, 1], l1=1e-3, noise="bipolar", sigma=0.1),
        ToyModel(5, 2, [0, 1]),
        UntiedAutoencoder(8, [2, 3], [0, 1]),
    ]
    for model in models:
        assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"cpu"}
    assert models[0].noise.next().device.type == "cpu"
    assert SparseUniform([0, 1], 4, 0.5).sample(3).device.type == "cpu"
    assert "-cpu-" in cache.cache_key(rug_training.train_group.uncached)


def test_prefetched_data_is_each_instances_own_stream():
    # Drawing several batches per generator call changes neither what an instance sees (on the
    # CPU, where a generator's draws do not depend on how they are split into calls) nor which
    # other instances are drawn with it: instance 1 sits out two draws and then goes on.
    plain = SparseUniform([3, 4, 5], 6, [0.5, 0.8, 0.9], device="cpu")
    prefetched = SparseUniform([3, 4, 5], 6, [0.5, 0.8, 0.9], device="cpu", prefetch=4)
    alone = SparseUniform([4], 6, [0.8], device="cpu", prefetch=3)
    for step in range(9):
        chosen = [0, 2] if step in (2, 3) else [0, 1, 2]
        batch = prefetched.sample(5, chosen)
        assert torch.equal(batch, plain.sample(5, chosen))
        if 1 in chosen:
            assert torch.equal(batch[1], alone.sample(5)[0])
    assert not torch.equal(prefetched.sample(5)[0], prefetched.sample(5)[0])


# --- the cache key ----------------------------------------------------------------------------


def test_the_cache_key_changes_with_the_device_type_and_the_library_versions(monkeypatch):
    shard = rug_training.train_group.uncached
    cpu, cuda = cache.cache_key(shard, "cpu"), cache.cache_key(shard, "cuda")
    assert cpu != cuda and cpu.startswith(cache.code_key(shard))
    assert cache.cache_key(shard, "cuda:1") == cuda  # the type, not which GPU
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert cache.cache_key(shard, "cpu") != cpu
    monkeypatch.undo()
    monkeypatch.setattr(np, "__version__", "0.0.1")
    assert cache.cache_key(shard, "cpu") != cpu


# --- shards: in-process, on a Dask cluster, and after an interruption --------------------------


def _grid(cache_dir, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(cache_dir))
    return rug.grid_runs([16, 32], [0.05, 0.3], [0.25, 0.5], [0, 1], steps=300)


def test_a_chapter_5_grid_on_a_local_dask_cluster_gives_the_in_process_numbers(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("TOYCORE_SCHEDULER", raising=False)
    here = _grid(tmp_path / "in-process", monkeypatch)
    benchmark = str(REPO_ROOT / "benchmarks" / "allocator.py")

    def faults_per_step():  # of a training step on a worker, once it has imported toycore
        import runpy

        return runpy.run_path(benchmark)["one_run"](warmup=20, steps=50)["faults"]

    # LocalCluster(n_workers=2, threads_per_worker=1, processes=True), whose nanny sets
    # MALLOC_TRIM_THRESHOLD_; toycore's allocator options hold there too: no temporary of the
    # step comes back as fresh pages
    bound = runpy.run_path(benchmark)["REUSED_BOUND"]
    with shards.local_cluster(2) as cluster:
        faults = shards._client(cluster.scheduler_address).run(faults_per_step)
        assert max(faults.values()) < bound, faults
        monkeypatch.setenv("TOYCORE_SCHEDULER", cluster.scheduler_address)
        # were any shard trained in this process, it would fail: the workers have their own copy
        monkeypatch.setattr(rug_training, "train_until_converged", None)
        try:
            there = _grid(tmp_path / "cluster", monkeypatch)
            workers = shards._client(cluster.scheduler_address).run(os.getpid)
        finally:
            shards._client(cluster.scheduler_address).close()
            shards._client.cache_clear()
    assert len(set(workers.values()) - {os.getpid()}) == 2
    for a, b in zip(here, there):
        for name in ("W", "b", "loss", "steps", "converged"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert np.array_equal(a.curves, b.curves, equal_nan=True)
    # the workers wrote every shard (one per ns and hidden size) into the caller's cache
    assert len(list((tmp_path / "cluster").rglob("*.pkl"))) == 4


def test_a_malformed_scheduler_address_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_SCHEDULER", "localhost:8786")
    monkeypatch.setattr(rug_training, "train_until_converged", None)
    with pytest.raises(ValueError, match="TOYCORE_SCHEDULER must be a Dask scheduler's address"):
        _grid(tmp_path, monkeypatch)


SWEEP = dict(features=8, hiddens=[8, 12, 16, 24], seeds=[0, 1], l1=1e-3, steps=60, lr=1e-3)

KILLED_ON_THIRD_SHARD = textwrap.dedent("""
    import os, signal, sys
    from toycore.experiments import polysemantic as ex
    train, calls = ex.train, []
    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the kernel dies while it trains the third shard
            os.kill(os.getpid(), signal.SIGKILL)
        return train(*args, **kwargs)
    ex.train = dying
    ex.polysemantic_sweep(**{sweep})
""")


def test_a_sweep_killed_midway_recomputes_only_the_unfinished_shards(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TOYCORE_SCHEDULER", raising=False)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_ON_THIRD_SHARD.format(sweep=SWEEP)],
        env={**os.environ, "TOYCORE_PROGRESS": "0"},
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL
    trained = []
    train = poly.train
    monkeypatch.setattr(
        poly, "train", lambda *a, **k: trained.append(a[0].hidden) or train(*a, **k)
    )
    resumed = poly.polysemantic_sweep(**SWEEP)
    assert trained == [16, 24]  # the two shards that had not finished, and no other
    poly.polysemantic_sweep(**SWEEP)
    assert trained == [16, 24]  # now all are cached: nothing trained again
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path / "uninterrupted"))
    whole = poly.polysemantic_sweep(**SWEEP)
    assert all(np.array_equal(a, b) for a, b in zip(resumed.W, whole.W))
    assert np.array_equal(resumed.counts, whole.counts)


def test_shards_must_be_cached_functions():
    with pytest.raises(ValueError, match="not a @cached function"):
        shards.run(len, [(([1],), {})])


# --- chapters side by side ---------------------------------------------------------------------


def test_a_build_starts_the_longest_chapters_first():
    chapters = config.select_chapters(None)

    def stems(order):
        return [nb.stem[:2] for nb in order]

    # a cold cpu build, no timings of its own: the cold costs, so short chapters end the build
    assert stems(execute.chapter_order(chapters, "cpu", {})) == ["05", "03", "04", "02", "01"]
    assert set(execute.COLD_SECONDS["cpu"]) == {nb.stem for nb in chapters}
    # a chapter it has timed goes by its own time
    timed = {"01_linear_autoencoders": 1000.0}
    assert stems(execute.chapter_order(chapters, "cpu", timed))[0] == "01"
    # a profile without cold costs: later chapters first, the timed after the untimed
    assert stems(execute.chapter_order(chapters, "ci", {})) == ["05", "04", "03", "02", "01"]
    assert stems(execute.chapter_order(chapters, "ci", {"05_persian_rug": 9.0}))[-1] == "05"


def test_chapters_and_jobs_are_checked_before_any_work(tmp_path):
    assert [nb.stem for nb in config.select_chapters(["05", "01_linear_autoencoders"])] == [
        "05_persian_rug",
        "01_linear_autoencoders",
    ]
    with pytest.raises(ValueError, match="no chapter '06'"):
        book.build("ci", tmp_path, only=["06"])
    for jobs in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
            book.build("ci", tmp_path, jobs=jobs)
    assert list(tmp_path.iterdir()) == []
    assert execute.check_jobs(None, "cpu") == os.cpu_count() and execute.check_jobs(8, "cpu") == 8


# --- the paper profile's records ---------------------------------------------------------------


# What an example record depends on (toycore.dependencies).
DEPENDS = Dependencies({"toycore.example.f": "0123"}, [["§1 cell 1", "4567"]])


def _part(rows, sections=None, **provenance):
    given = dict(
        commit="0123456789abcdef",
        uncommitted_changes=False,
        code=DEPENDS.key,
        device="NVIDIA H100 80GB HBM3",
        device_type="cuda",
        matmul="float32",
        torch="2.13.0",
        numpy="2",
        scipy="1",
        python="3.12",
        wall_time_s=61.0,
        chapters_at_once=1,
        recorded="2026-11-23 10:00 UTC",
    )
    return dict(
        sections=sections,
        provenance={**given, **provenance},
        dependencies=DEPENDS.to_json(),
        rows=rows,
    )


def _record(*parts):
    return dict(chapter="99_example", profile="paper", parts=list(parts))


def _row(claim_id, passed, known_failure=False, profile="paper"):
    return dict(
        id=claim_id,
        claim=f"claim {claim_id} | with a bar",
        source="§1",
        expected=1.0,
        measured=1.0,
        tolerance=0.0,
        compare="abs",
        passed=passed,
        known_failure=known_failure,
        profile=profile,
        chapter="99_example",
    )


def test_records_are_checked_written_and_read_back(tmp_path):
    part = _part([_row("a", True), _row("b", False, known_failure=True)])
    good = _record(part)
    assert records.check(good) == []
    path = records.write_parts("99_example", [part], tmp_path)
    assert records.load(tmp_path) == {"99_example": good} and path.name == "99_example.json"
    # A rebuild served from the cache keeps the record of the run that computed the rows.
    again = {**part, "provenance": {**part["provenance"], "wall_time_s": 2.0}}
    assert records.new_parts("99_example", [again], folder=tmp_path) == []
    changes = ({"torch": "2.14.0"}, {"code": "new"}, {"device_type": "cpu"}, {"matmul": "tf32"})
    for changed in changes:
        other = {**part, "provenance": {**part["provenance"], **changed}}
        assert records.new_parts("99_example", [other], folder=tmp_path) == [other]
    fewer = {**part, "rows": [_row("a", True)]}
    assert records.new_parts("99_example", [fewer], folder=tmp_path) == [fewer]
    assert records.new_parts("98_none", [part], folder=tmp_path) == [part]
    assert records.new_parts("99_example", [], folder=tmp_path) == []
    bad = [
        _part([]),
        _part([_row("a", True), _row("a", True)]),
        _part([_row("a", True, profile="cpu")]),
        _part([_row("a", True)], device_type="tpu"),
        {**_part([_row("a", True)]), "provenance": {"device": "x"}},
        _part([{**_row("a", True), "passed": None}]),
        _part([_row("a", True)], code="another"),  # not the key of its dependencies
    ]
    for wrong in bad:
        assert records.check(_record(wrong)), wrong
        with pytest.raises(ValueError, match="not a record of 99_example"):
            records.write_parts("99_example", [wrong], tmp_path)
    assert records.check(_record({**part, "dependencies": {}})) == [
        "part 1: no dependencies (what its numbers depend on)"
    ]
    assert records.check(_record(part, part)) == [
        "part 1 overlaps another part",
        "a claim id appears twice",
    ]
    assert (
        "part 1's sections are not a sorted list"
        in records.check(_record(_part([_row("a", True)], sections=[3, 1])))[0]
    )


def test_a_part_replaces_the_parts_it_overlaps(tmp_path):
    def write(rows, sections):
        records.write_parts("99_example", [_part(rows, sections)], tmp_path)
        return [p["sections"] for p in records.load(tmp_path)["99_example"]["parts"]]

    assert write([_row("a", True)], [1, 2, 3]) == [[1, 2, 3]]
    assert write([_row("b", True)], [5]) == [[1, 2, 3], [5]]
    assert write([_row("c", True)], [4]) == [[1, 2, 3], [4], [5]]
    assert write([_row("d", True)], [3, 4]) == [[3, 4], [5]]  # overlaps two
    assert [row["id"] for row in records.recorded_rows("99_example", folder=tmp_path)] == ["d", "b"]
    records.write_parts("99_example", [_part([_row("f", True)], [6], device="a CPU")], tmp_path)
    assert records.recorded_devices("99_example", tmp_path) == {
        "d": "NVIDIA H100 80GB HBM3",
        "b": "NVIDIA H100 80GB HBM3",
        "f": "a CPU",
    }
    assert records.recorded_devices("99_missing", tmp_path) == {}
    assert write([_row("e", True)], None) == [None]  # the whole chapter replaces every part


def test_a_part_made_again_with_the_same_values_keeps_the_run_that_first_made_them(tmp_path):
    """After an edit that moves no number, a part is made again from the result cache in
    seconds; its provenance keeps the commit, date, device and time of the run that computed
    its values, through any number of such re-makes, and the Reproducing page says so."""
    first = _part([_row("a", True)], [3], wall_time_s=1676.0)
    records.write_parts("99_example", [first], tmp_path)

    def again(rows, commit, **provenance):
        moved = Dependencies({f"toycore.example.{commit}": "89ab"}, DEPENDS.cells)
        part = _part(rows, [3], commit=commit, wall_time_s=8.0, code=moved.key, **provenance)
        records.write_parts("99_example", [{**part, "dependencies": moved.to_json()}], tmp_path)
        (held,) = records.load(tmp_path)["99_example"]["parts"]
        assert records.check(records.load(tmp_path)["99_example"]) == []
        return held["provenance"].get("first_run")

    made = dict(commit=first["provenance"]["commit"], recorded="2026-11-23 10:00 UTC")
    made.update(uncommitted_changes=False)
    made.update(device="NVIDIA H100 80GB HBM3", wall_time_s=1676.0)
    reworded = {**_row("a", True), "claim": "claim a, in other words", "why": "a reason"}
    assert again([reworded], "fedcba9876543210") == made
    assert again([_row("a", True)], "0f0f0f0f0f0f0f0f") == made  # through a second re-make
    page = reports.paper_comparison(
        {"99_example": [_row("a", True)]}, records.load(tmp_path), {"99_example": "An example"}, {}
    )
    assert "identical to those of an earlier run (commit `0123456789`, recorded" in page
    assert "that run took 27.9 min" in page and "in 0.1 min" in page
    # a first run no longer than the part's own, or one lacking what says where it ran
    for wrong in ({**made, "wall_time_s": 8.0}, {**made, "commit": None}, {}):
        part = records.load(tmp_path)["99_example"]["parts"][0]
        part["provenance"]["first_run"] = wrong
        assert records.check(_record(part)), wrong
    # another number, another row, another device type or library: a new run of its own
    assert again([{**_row("a", True), "measured": 0.5}], "1111111111111111") is None
    records.write_parts("99_example", [first], tmp_path)
    assert again([_row("a", True), _row("b", True)], "2222222222222222") is None
    records.write_parts("99_example", [first], tmp_path)
    assert again([_row("a", True)], "3333333333333333", torch="2.14.0") is None


def test_a_part_says_what_its_run_read_from_the_result_cache_and_keeps_it_in_a_first_run(
    tmp_path,
):
    def page():
        return reports.paper_comparison(
            {"99_example": [_row("a", True)]},
            records.load(tmp_path),
            {"99_example": "An example"},
            {},
        )

    read = dict(results=14, computed_s=5880.0, unknown=3)
    first = _part([_row("a", True)], [3], wall_time_s=12.0, from_cache=read)
    assert records.check(_record(first)) == []
    records.write_parts("99_example", [first], tmp_path)
    assert (
        "in 0.2 min (one chapter at a time): 1 of 1 reproduces.\n It read 14 results from the "
        "result cache, which earlier runs took 98.0 min to compute (3 of them with no time "
        "kept): that time is not in the time above." in page()
    )
    # made again from the cache: the first run keeps what it read
    moved = Dependencies({"toycore.example.g": "89ab"}, DEPENDS.cells)
    again = _part([_row("a", True)], [3], wall_time_s=2.0, code=moved.key)
    records.write_parts("99_example", [{**again, "dependencies": moved.to_json()}], tmp_path)
    (held,) = records.load(tmp_path)["99_example"]["parts"]
    assert held["provenance"]["first_run"]["from_cache"] == read
    assert "that run took 0.2 min and read 14 results from the result cache)" in page()
    assert records.check(records.load(tmp_path)["99_example"]) == []
    records.write_parts(
        "99_example", [_part([_row("a", True)], [3], from_cache={**read, "unknown": 14})], tmp_path
    )
    assert (
        "It read 14 results from the result cache, computed by earlier runs whose time was "
        "not kept." in page()
    )
    for wrong in (
        {**read, "unknown": 15},
        {**read, "results": 2.0},
        {**read, "computed_s": -1.0},
        {"results": 1},
    ):
        assert (
            "provenance's from_cache"
            in records.check(_record(_part([_row("a", True)], from_cache=wrong)))[0]
        ), wrong


@cache.cached
def _inner(x):
    time.sleep(0.2)
    return x + 1


@cache.cached
def _outer(x):
    time.sleep(0.1)
    return 2 * _inner(x)


@cache.cached
def _shard_of_inner(x):
    return _inner(x)


def _new_run(monkeypatch, report):
    """This process as a fresh run's kernel: no results used yet, reporting into ``report``."""
    monkeypatch.setattr(cache, "_IN_PROGRESS", [cache._Computation()])
    monkeypatch.setattr(cache, "_REPORTED", [None])
    monkeypatch.setenv("TOYCORE_CACHE_READS", str(report))
    monkeypatch.setenv("TOYCORE_RUN_STARTED", repr(time.time()))


def test_a_run_says_what_it_read_from_the_cache_and_how_long_computing_it_took(
    tmp_path, monkeypatch
):
    """Each stored result keeps its own computing time (not that of the cached results computed
    inside it) and what it was made of; a run that reads it later lists it, and all it was made
    of, once each, as results that earlier runs computed, whether its kernel read them or a
    shard's worker did; a result this run computed is not among them."""
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TOYCORE_SCHEDULER", raising=False)
    report = tmp_path / "reads.json"
    _new_run(monkeypatch, report)
    began = time.perf_counter()
    assert _outer(1) == 4
    took = time.perf_counter() - began
    assert cache.earlier_results(report) == dict(results=0, computed_s=0.0, unknown=0)
    outer_file = cache.result_file(_outer.uncached, (1,), {})
    inner_file = cache.result_file(_inner.uncached, (1,), {})
    assert cache._load(outer_file) == 4 and cache._load(inner_file) == 2  # as they always were
    outer, inner = cache._timing(outer_file), cache._timing(inner_file)
    assert inner.seconds >= 0.2 and outer.seconds >= 0.1
    assert inner.seconds + outer.seconds <= took  # each second counted once
    # named under the cache's root, so a cache moved or restored elsewhere names them alike
    assert list(outer.made_of) == [str(inner_file.relative_to(tmp_path / "cache"))]

    _new_run(monkeypatch, report)
    assert _outer(1) == 4 and _inner(1) == 2  # the inner one twice: counted once
    assert cache.earlier_results(report) == dict(
        results=2, computed_s=round(outer.seconds + inner.seconds, 1), unknown=0
    )
    # a shard computed in this run, from a result an earlier run computed
    _new_run(monkeypatch, report)
    assert shards.run(_shard_of_inner, [((1,), {})]) == [2]
    assert cache.earlier_results(report)["results"] == 1
    # a result stored before the cache kept times (no file beside it): counted, time unknown
    old = cache.result_file(_inner.uncached, (7,), {})
    old.parent.mkdir(parents=True, exist_ok=True)
    payload = pickle.dumps(8)
    old.write_bytes(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    _new_run(monkeypatch, report)
    assert _inner(7) == 8
    assert cache.earlier_results(report) == dict(results=1, computed_s=0.0, unknown=1)
    assert cache.earlier_results(tmp_path / "none.json")["results"] == 0


def test_every_record_is_current_or_says_what_changed():
    """A part of a record is stale exactly when the code it depends on changed: it then says
    which functions or cells, in a short list."""
    for chapter, record in records.load().items():
        for part in record["parts"]:
            changed = records.staleness(chapter, part)
            now = records.chapter_dependencies(chapter, part["sections"])
            assert (changed == []) == (now.key == part["dependencies"]["key"])
            assert 0 < len(changed) <= 8 or not changed
    part = _part([_row("a", True)])
    assert records.staleness("05_persian_rug", part, DEPENDS) == []
    moved = Dependencies({"toycore.example.f": "89ab"}, DEPENDS.cells)
    assert records.staleness("05_persian_rug", part, moved) == ["example.f"]
    assert records.staleness("05_persian_rug", {"sections": None}) == [
        "the record does not list what it depends on"
    ]


def test_the_comparison_puts_each_claim_beside_its_recorded_verdict():
    here = {
        "99_example": [
            _row("a", True, profile="ci"),
            _row("b", True, profile="ci"),
            _row("new", False, known_failure=True, profile="ci"),
        ],
        "98_unrecorded": [{**_row("x", True, profile="ci"), "chapter": "98_unrecorded"}],
    }
    recorded = {
        "99_example": _record(_part([_row("a", True), _row("b", False), _row("old", True)]))
    }
    text = reports.paper_comparison(
        here, recorded, {"99_example": "Example"}, stale={"99_example": [["example.f"]]}
    )
    example, unrecorded = text.split("### [98_unrecorded]")
    assert "recorded 2026-11-23 10:00 UTC on NVIDIA H100 80GB HBM3" in example
    assert "commit `0123456789`" in example and "2 of 3 reproduce" in example
    assert "record is stale: since it was made, this changed: example.f" in example
    rows = [line for line in example.split("<tr>")[2:]]
    assert (
        "claim a | with a bar<br><small><code>a</code></small></td><td>reproduces</td>"
        "<td>reproduces" in rows[0]
    )
    assert (
        "<td>reproduces</td><td><strong>does not reproduce</strong>, <strong>unexpected" in rows[1]
    )
    assert "(explained)</td><td>not recorded</td>" in rows[2]
    assert "<td>not in this build</td><td>reproduces</td>" in rows[3]
    assert "has not been run for this chapter" in unrecorded and "<td>not run</td>" in unrecorded
    same_code = reports.paper_comparison(here, recorded, {}, stale={"99_example": [[]]})
    assert "stale" not in same_code


def test_a_partial_record_says_what_it_holds_and_leaves_the_rest_not_run(tmp_path):
    early = _part([_row("a", True)], [1, 2, 3])
    fig3 = _part([_row("c", False)], [5], recorded="2026-11-24 11:00 UTC")  # another run
    for part in (early, fig3):
        records.write_parts("99_example", [part], tmp_path)
    (record,) = records.load(tmp_path).values()
    assert record == _record(early, fig3) and records.check(record) == []
    # a whole record and a partial one are not the same run
    whole = {**early, "sections": None}
    assert records.new_parts("99_example", [whole], tmp_path) == [whole]
    # a run of both whose section 5 changed: only that part is new, section 1 to 3's is kept
    changed = {**fig3, "rows": [_row("c", True)]}
    assert records.new_parts("99_example", [early, changed], tmp_path) == [changed]
    here = {"99_example": [_row(k, True, profile="ci") for k in "abc"]}
    text = reports.paper_comparison(here, {"99_example": record}, {}, stale={})
    assert "Paper profile, sections 1 to 3, recorded" in text and "1 of 1 reproduce" in text
    assert "Paper profile, section 5, recorded" in text and "0 of 1 reproduce" in text
    assert (
        "claim b | with a bar<br><small><code>b</code></small></td><td>reproduces</td>"
        "<td>not run</td>" in text
    )


def test_a_part_runs_its_sections_and_only_what_they_need_of_the_others(tmp_path):
    notebook = REPO_ROOT / "chapters" / "05_persian_rug.ipynb"
    copy = config.chapter_part(notebook, [1, 2, 3, 5], tmp_path)
    cells = nbformat.read(copy, as_version=4).cells
    code = {c.source for c in cells if c.cell_type == "code"}
    section, by_section = "setup", {}
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.source.startswith("## "):
            section = cell.source.splitlines()[0][3:].split(".")[0]
        elif cell.cell_type == "code":
            by_section.setdefault(section, []).append(cell.source)
    for section in ("setup", "1", "3", "5", "Claims ledger"):  # whole
        assert all(source in code for source in by_section[section]), section
    for section in ("4", "6", "9"):  # not at all: section 5 needs nothing of them
        assert not any(source in code for source in by_section[section]), section
    assert cells[-1].source.startswith("ledger.save()")
    # section 8 needs the headline's models from section 3: just those statements, no rows
    copy = config.chapter_part(notebook, [8], tmp_path)
    code = "\n".join(
        c.source for c in nbformat.read(copy, as_version=4).cells if c.cell_type == "code"
    )
    assert "sweep = ex.size_sweep(" in code and "macro.trained" in code
    assert "headline.ns" not in code and "construct.diagonal" not in code
    # section 11 goes past the headline's sweep, not Figure 2's grids, which it never reads
    copy = config.chapter_part(notebook, [11], tmp_path)
    code = "\n".join(
        c.source for c in nbformat.read(copy, as_version=4).cells if c.cell_type == "code"
    )
    assert "sweep = ex.size_sweep(" in code and "ex.grid_runs(" not in code
    with pytest.raises(ValueError, match="has no section 98"):
        config.chapter_part(notebook, [98], tmp_path)
    with pytest.raises(ValueError, match="--sections needs exactly one chapter"):
        book.build("ci", tmp_path, only=None, sections="1-3")
    with pytest.raises(ValueError, match="sections are numbers and ranges"):
        book.build("ci", tmp_path, only=["05"], sections="1-x")


def claim_ids_in(notebook):
    """What a chapter's code can name as a claim id: its string constants, and its f-strings
    as patterns (a claim made per case, e.g. f"thomson.n{n}m{m}", has ids the paper profile
    makes and the small profiles do not)."""
    import ast
    import re

    import nbformat

    names, patterns = set(), []
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                patterns.append(
                    "".join(
                        re.escape(part.value) if isinstance(part, ast.Constant) else ".+"
                        for part in node.values
                    )
                )
    return lambda claim_id: (
        claim_id in names or any(re.fullmatch(pattern, claim_id) for pattern in patterns)
    )


def test_paper_records_are_well_formed_and_name_claims_their_chapters_make():
    notebooks = {nb.stem: nb for nb in config.chapters()}
    for stem, record in records.load().items():
        assert stem in notebooks, f"results/paper/{stem}.json: no such chapter"
        assert records.check(record) == [] and record["chapter"] == stem
        assert record["profile"] == "paper"
        makes = claim_ids_in(notebooks[stem])
        unknown = [row["id"] for row in records.rows_of(record) if not makes(row["id"])]
        assert not unknown, f"{stem}: the record has claims the chapter no longer makes: {unknown}"
    assert not claim_ids_in(notebooks["02_relu_output_model"])("thomson")  # the check can fail


def test_the_intro_shows_the_paper_verdicts_or_says_none_was_recorded(built):
    from bs4 import BeautifulSoup

    build_dir, _ = built
    soup = BeautifulSoup((build_dir / "html" / "intro.html").read_text(), "html.parser")
    tables = soup.find_all("table", class_="paper-comparison")
    recorded = records.load()
    assert len(tables) == len(config.chapters())
    for notebook, table in zip(config.chapters(), tables):
        claims = json.loads((build_dir / "claims" / f"{notebook.stem}.json").read_text())
        cells = [row.find_all("td") for row in table.find_all("tr")[1:]]
        assert len(cells) >= len(claims)
        said = table.find_previous("p").get_text()
        if notebook.stem in recorded:
            record = recorded[notebook.stem]
            sectioned = any(part["sections"] for part in record["parts"])
            partial = not records.holds_every_section(record)
            assert ("Paper profile, section" if sectioned else "Paper profile recorded") in said
            assert record["parts"][0]["provenance"]["device"] in said
            assert {c[2].get_text() for c in cells} <= {
                "reproduces",
                "does not reproduce, unexpected",
                "does not reproduce (explained)",
                "reproduces, unexpected: listed as a known failure",
                "outside the text's regime",
                "not run" if partial else "not recorded",
            }
        else:
            assert "has not been run" in said and {c[2].get_text() for c in cells} == {"not run"}


def test_tf32_products_are_emulated_on_the_cpu_and_named_in_the_cache_key(monkeypatch):
    x = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-10 + 2**-12, -(2 + 2**-9)])
    assert torch.equal(devices.matmul_operand(x), x)  # float32 by default: untouched
    key = cache.cache_key(rug_training.train_group.uncached, "cpu")
    monkeypatch.setenv("TOYCORE_MATMUL", "tf32")
    rounded = devices.matmul_operand(x)  # 10 mantissa bits, ties to even
    assert rounded.tolist() == [1.0, 1 + 2**-9, 1 + 2**-10, -(2 + 2**-9)]
    assert torch.equal(devices.matmul_operand(x.double()), x.double())  # float64: not products
    assert "-cpu-tf32-" in cache.cache_key(rug_training.train_group.uncached, "cpu") != key
    monkeypatch.setenv("TOYCORE_MATMUL", "bf16")
    with pytest.raises(ValueError, match="TOYCORE_MATMUL must be float32 or tf32"):
        devices.use("cpu")


def test_a_chapter_says_where_its_record_stands_part_by_part(tmp_path, monkeypatch):
    early = _part([_row("a", True)], [1, 2, 3])
    late = _part([_row("b", False)], [5], recorded="2026-11-23 11:00 UTC")  # another run
    for part in (early, late):
        records.write_parts("99_example", [part], tmp_path)
    monkeypatch.setattr(
        records, "staleness", lambda chapter, part: [] if part["sections"] == [5] else ["x.f"]
    )
    said = records.status("99_example", tmp_path)
    assert said.startswith("The texts' sizes (paper profile): Sections 1 to 3 recorded")
    assert "; stale. Sections 1 to 3: since it was made, this changed: x.f." in said
    assert "Section 5 recorded 2026-11-23 11:00 UTC on NVIDIA H100 80GB HBM3" in said
    # with a stale part, its own sentence says what changed; the current ones say "current"
    assert said.endswith("commit 0123456789; current.") and "None of the code" not in said
    # a section's table speaks of the runs that hold its sections only
    assert records.status("99_example", tmp_path, [5]) == (
        "The texts' sizes (paper profile): Section 5 recorded 2026-11-23 11:00 UTC on NVIDIA H100 "
        "80GB HBM3, commit 0123456789; current. None of the code their rows depend on "
        "has changed since they were made."
    )
    assert records.status("99_example", tmp_path, [4]).endswith(
        "have not been run for section 4 yet."
    )
    assert records.status("98_none", tmp_path).endswith("not been run for this chapter yet.")
    assert records.recorded_text("99_example", "a", ".1f", tmp_path) == "1.0"
    assert records.recorded_text("99_example", "zz", folder=tmp_path) == "not yet recorded"
    # a verdict in words: an out-of-regime row is said not to count; a missing one, unrecorded
    assert records.verdict_text(records.recorded_row("99_example", "b", tmp_path)) == (
        "does not hold"
    )
    assert records.verdict_text(dict(passed=True, outside_regime="n < 4")) == (
        "holds (outside the text's regime: not counted)"
    )
    rows = [dict(id="a", passed=True), dict(id="b", passed=False), dict(id="c", passed=False)]
    assert records.all_held(rows[:1]) == "all hold"
    assert records.all_held(rows[:2]) == "do not all hold (b does not)"
    assert records.all_held(rows) == "do not all hold (b and c do not)"
    assert records.verdict_text(records.recorded_row("99_example", "zz", tmp_path)) == (
        "is not yet recorded"
    )
    assert records.recorded_held("99_example", "b", tmp_path) == "does not hold"
    assert records.recorded_held("99_example", "zz", tmp_path) == "is not yet recorded"
    ledger = Ledger("99_example", "ci")
    ledger.equal("a", "c", "s", expected=1, measured=1)
    table = records.ledger_table(ledger, tmp_path)._repr_html_()
    assert "Claims ledger: 1 of 1 reproduce" in table and "this changed: x.f" in table
    # the parts one run was split into read as one run, each stale part named
    split = [_part([_row("c", True)], [6]), _part([_row("d", True)], [7])]
    for part in split:
        part["provenance"]["recorded"] = "2026-11-24 09:00 UTC"
    records.write_parts("99_example", split, tmp_path)
    monkeypatch.setattr(
        records, "staleness", lambda chapter, part: ["y.g"] if part["sections"] == [7] else []
    )
    said = records.status("99_example", tmp_path)
    assert (
        "Sections 6 and 7 recorded 2026-11-24 09:00 UTC on NVIDIA H100 80GB HBM3, commit "
        "0123456789; stale in part. Section 7: since it was made, this changed: y.g."
    ) in said
    parts = records.load(tmp_path)["99_example"]["parts"]
    assert [part["sections"] for part in parts] == [[1, 2, 3], [5], [6], [7]]
    assert records.runs(parts) == [[0], [1], [2, 3]] and records.run_sections(parts[2:]) == [6, 7]
