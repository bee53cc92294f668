import json

import pytest

from toycore import cache, profiles
from toycore.claims import Ledger, load_ledgers, unexpected_verdicts


def test_ledger_verdicts_and_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_BUILD_DIR", str(tmp_path))
    ledger = Ledger("99_example", "ci")
    assert ledger.check("a", "close", "§1", 1.0, 1.05, 0.1)["passed"]
    assert not ledger.check("b", "too far", "§1", 1.0, 1.2, 0.1)["passed"]
    assert ledger.check("c", "relative", "§2", 100.0, 104.0, 0.05, compare="rel")["passed"]
    assert not ledger.check("d", "upper bound", "§2", 0.0, 2e-6, 1e-6, compare="le")["passed"]
    assert ledger.check("e", "lower bound", "§3", 0.01, 0.5, 0.0, compare="ge", spread=0.1)[
        "passed"
    ]
    assert not ledger.all_passed
    path = ledger.save()
    assert path == tmp_path / "claims" / "99_example.json"
    rows = json.loads(path.read_text())
    assert [r["id"] for r in rows] == list("abcde")
    for key in ("id", "claim", "source", "expected", "measured", "tolerance", "passed", "profile"):
        assert all(key in r for r in rows)
    assert rows[0]["profile"] == "ci" and rows[4]["spread"] == 0.1
    assert load_ledgers(tmp_path / "claims") == {"99_example": rows}
    html = ledger.table()._repr_html_()
    assert "3 of 5 reproduce" in html and html.count("does not reproduce") == 2
    assert "0 of 1 reproduce" in ledger.table("b")._repr_html_()


def test_known_failures_keep_their_computed_verdict():
    ledger = Ledger("x", "ci")
    ledger.check("a", "holds", "s", 1.0, 1.0, 0.0)
    row = ledger.check("b", "shown not to hold", "s", 1.0, 3.0, 0.5, known_failure=True)
    assert not row["passed"] and row["known_failure"]
    assert not ledger.all_passed and unexpected_verdicts(ledger.rows) == []
    assert "explained in the chapter" in ledger.table("b")._repr_html_()
    ledger.check("c", "said not to hold, but does", "s", 1.0, 1.0, 0.0, known_failure=True)
    assert unexpected_verdicts(ledger.rows) == ["c"]


def test_ledger_rejects_bad_rows():
    ledger = Ledger("x", "ci")
    ledger.check("a", "c", "s", 1, 1, 0)
    with pytest.raises(ValueError, match="duplicate"):
        ledger.check("a", "c", "s", 1, 1, 0)
    with pytest.raises(ValueError, match="compare"):
        ledger.check("b", "c", "s", 1, 1, 0, compare="approx")
    with pytest.raises(ValueError, match="NaN"):
        ledger.check("b", "c", "s", 1, float("nan"), 0)
    with pytest.raises(ValueError, match="tolerance"):
        ledger.check("b", "c", "s", 1, 1, -1)


def test_profiles(monkeypatch):
    monkeypatch.delenv("TOYCORE_PROFILE", raising=False)
    assert profiles.resolve_profile() == "cpu"
    monkeypatch.setenv("TOYCORE_PROFILE", "paper")
    assert profiles.resolve_profile() == "paper"
    assert profiles.resolve_profile("ci") == "ci"
    with pytest.raises(ValueError, match="profile must be one of ci, cpu, paper"):
        profiles.resolve_profile("gpu")
    chosen = profiles.select("ci", ci=dict(n=1), cpu=dict(n=2), paper=dict(n=3))
    assert chosen.n == 1 and chosen.profile == "ci"
    with pytest.raises(ValueError, match="missing"):
        profiles.select("ci", ci=dict(n=1), cpu=dict(n=2))


calls = []


@cache.cached
def _square(x):
    calls.append(x)
    return x * x


def test_cache_reuses_results_and_is_keyed_by_code(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))
    calls.clear()
    assert _square(3) == 9 and _square(3) == 9 and _square(4) == 16
    assert calls == [3, 4]
    assert [p.name for p in tmp_path.iterdir()] == [cache.cache_key(__name__)]
    assert cache.cache_key(__name__).startswith(cache.code_hash(__name__))
    monkeypatch.setattr(cache, "code_hash", lambda module=None: "changed-code")
    assert _square(3) == 9
    assert calls == [3, 4, 3]


def test_cache_key_covers_a_chapters_own_modules_and_not_other_chapters():
    relu = cache._chapter_modules("toycore.experiments.relu")
    assert relu == {"toycore.experiments.relu", "toycore.theory.relu"}
    assert cache._chapter_modules("toycore.experiments.linear") == {
        "toycore.experiments.linear",
        "toycore.theory.linear",
    }
    shared = cache.code_hash(__name__)
    assert (
        len(
            {
                shared,
                cache.code_hash("toycore.experiments.relu"),
                cache.code_hash("toycore.experiments.linear"),
                cache.code_hash(),
            }
        )
        == 4
    )


def test_every_toycore_module_is_classed_as_computing_or_outside_the_key():
    # A module not listed as outside the key is hashed into every chapter's cache key: a
    # build-only module left off that list would make every change to it retrain the whole book.
    modules = {
        path.name
        for path in cache.PACKAGE.iterdir()
        if path.suffix == ".py" or (path / "__init__.py").exists()
    }
    computing = {
        "__init__.py",
        "cache.py",
        "checks.py",
        "data.py",
        "models.py",
        "noise.py",
        "paths.py",
        "profiles.py",
        "seeding.py",
        "train.py",
        "theory",
        "experiments",
    }
    assert modules - cache.OUTSIDE_KEY == computing
    assert cache.SHARED | set(cache.CHAPTER_PACKAGES) == computing
    assert cache.OUTSIDE_KEY <= modules
