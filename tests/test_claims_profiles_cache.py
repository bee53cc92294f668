import contextlib
import json
import time

import pytest

from toycore import cache, profiles, progress
from toycore.book import reports
from toycore.claims import (
    BesideTable,
    Ledger,
    LedgerTable,
    claim_in_full,
    load_ledgers,
    recorded_as,
    seed_tolerance,
    unexpected_verdicts,
    verdict_groups,
)
from toycore.experiments import hidden_noise, linear, persian_rug, polysemantic, relu


def test_ledger_verdicts_and_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_BUILD_DIR", str(tmp_path))
    ledger = Ledger("99_example", "ci")
    assert ledger.close_to("a", "close", "§1", expected=1.0, measured=1.05, tolerance=0.1)["passed"]
    assert not ledger.close_to("b", "too far", "§1", expected=1.0, measured=1.2, tolerance=0.1)[
        "passed"
    ]
    relative = ledger.close_to(
        "c", "relative", "§2", expected=100.0, measured=104.0, tolerance=0.05, relative=True
    )
    assert relative["passed"] and relative["compare"] == "rel"
    assert not ledger.at_most("d", "upper bound", "§2", measured=2e-6, bound=1e-6)["passed"]
    lower = ledger.at_least("e", "lower bound", "§3", measured=0.5, bound=0.01, spread=0.1)
    assert lower["passed"] and (lower["expected"], lower["tolerance"]) == (0.01, 0.0)
    assert ledger.equal("f", "a count", "§4", expected=3, measured=3)["passed"]
    assert not ledger.equal("g", "a count", "§4", expected=3, measured=3.001)["passed"]
    assert ledger.at_most("h", "at the bound", "§5", measured=1.0, bound=1.0)["passed"]
    assert not ledger.at_least("i", "below", "§5", measured=0.99, bound=1.0)["passed"]
    assert not ledger.all_passed
    assert ledger.row("b") is ledger.rows[1] and not ledger.row("i")["passed"]
    with pytest.raises(KeyError, match="no row 'z'"):
        ledger.row("z")
    path = ledger.save()
    assert path == tmp_path / "claims" / "99_example.json"
    rows = json.loads(path.read_text())
    assert [r["id"] for r in rows] == list("abcdefghi")
    for key in (
        "id",
        "claim",
        "source",
        "expected",
        "measured",
        "tolerance",
        "compare",
        "passed",
        "profile",
    ):
        assert all(key in r for r in rows)
    assert rows[0]["profile"] == "ci" and rows[4]["spread"] == 0.1
    assert load_ledgers(tmp_path / "claims") == {"99_example": rows}
    html = ledger.table()._repr_html_()
    assert "5 of 9 reproduce" in html and html.count("does not reproduce") == 4
    assert "≤ 1e-06" in html and "≥ 0.01" in html
    assert "0 of 1 reproduce" in ledger.table("b")._repr_html_()


def test_a_bound_recorded_with_a_tolerance_shows_the_bound_it_checked():
    row = dict(
        id="x",
        claim="c",
        source="s",
        expected=0.0,
        measured=0.5,
        tolerance=1.0,
        compare="le",
        passed=True,
        spread=None,
        note="",
        known_failure=False,
        profile="ci",
        chapter="x",
    )
    assert "<td>≤ 1</td>" in LedgerTable([row])._repr_html_()


def test_known_failures_keep_their_computed_verdict_and_are_expected_while_explained():
    ledger = Ledger("x", "ci")
    ledger.equal("a", "holds", "s", expected=1.0, measured=1.0)
    row = ledger.close_to(
        "b",
        "shown not to hold",
        "s",
        expected=1.0,
        measured=3.0,
        tolerance=0.5,
        known_failure="a",
        why="the chapter shows why",
    )
    assert not row["passed"] and row["known_failure"] and row["explained_by"] == "a"
    assert not ledger.all_passed and unexpected_verdicts(ledger.rows) == []
    # the explanation named as the verdicts and the prose name it, linked to its row
    assert (
        'explained: <a href="#claim-a"><code>a</code></a> holds' in ledger.table("b")._repr_html_()
    )
    # a known failure that reproduces after all is unexpected
    ledger.equal(
        "c", "said not to hold", "s", expected=1.0, measured=1.0, known_failure="a", why="w"
    )
    assert unexpected_verdicts(ledger.rows) == ["c"]
    # so is one whose explanation fails, or was not run
    ledger.equal("e", "an explanation that fails", "s", expected=1.0, measured=2.0)
    ledger.equal("f", "explained by e", "s", expected=1.0, measured=2.0, known_failure="e", why="w")
    ledger.equal(
        "g", "explained by nothing", "s", expected=1, measured=2, known_failure="z", why="w"
    )
    assert unexpected_verdicts(ledger.rows) == ["c", "e", "f", "g"]
    ledger.equal("h", "too few features", "s", expected=1, measured=2, outside_regime="n < 4")
    # b fails as explained; c, f and g are known failures whose verdict is not the expected one
    assert verdict_groups(ledger.rows) == dict(
        known=["b"], outside=["h"], unexpected=["c", "e", "f", "g"]
    )
    html = ledger.table()._repr_html_()
    assert 'its explanation <a href="#claim-e"><code>e</code></a> fails' in html
    assert 'its explanation <a href="#claim-z"><code>z</code></a> was not run' in html
    with pytest.raises(ValueError, match="why="):  # a known failure says why, in one sentence
        ledger.equal("d", "c", "s", expected=1.0, measured=2.0, known_failure="a")
    with pytest.raises(ValueError, match="names the row that tests its explanation"):
        ledger.equal("d", "c", "s", expected=1.0, measured=2.0, known_failure=True, why="w")
    with pytest.raises(ValueError, match="cannot explain itself"):
        ledger.equal("d", "c", "s", expected=1.0, measured=2.0, known_failure="d", why="w")


def test_the_findings_list_failures_slips_and_claims_outside_the_regime():
    ledger = Ledger("03_incidental_polysemanticity", "ci")
    ledger.equal("law.a", "reproduces", "s", expected=1, measured=1)
    ledger.equal(
        "law.b",
        "fails, explained",
        "s",
        expected=1,
        measured=2,
        known_failure="law.a",
        why="too few steps",
    )
    ledger.equal("law.c", "fails, unexplained", "s", expected=1, measured=2)
    ledger.equal("law.d", "checked outside", "s", expected=1, measured=2, outside_regime="tiny n")
    # a conditional known failure that does not apply here: its why explains nothing
    ledger.equal(
        "law.f", "fails, its why not meant for it", "s", expected=1, measured=3, why="not this"
    )
    ledger.equal(
        "law.g",
        "said to fail, reproduces",
        "s",
        expected=1,
        measured=1,
        known_failure="law.a",
        why="the old explanation",
    )
    ledger.correction("law.slip", "§2", "a wrong 4", fix="we keep the 4")
    recorded_row = dict(ledger.rows[0], passed=False, measured=0.758)  # fails at the texts' sizes
    # a known failure recorded before rows said why in one sentence and named their explanation
    older = dict(ledger.rows[1], id="law.e", claim="recorded only")
    del older["why"], older["explained_by"]
    record = {"parts": [{"sections": None, "rows": [recorded_row, older]}]}

    def page(stale):
        return reports.findings(
            {ledger.chapter: ledger.rows},
            {ledger.chapter: ledger.corrections},
            {ledger.chapter: record},
            {ledger.chapter: {"claim-law-b"}},
            {ledger.chapter: [stale]},
        )

    current = page([])
    # at a glance: the counts, each explanation with its claims' values, the unexpected ones
    glance = current.split("## Incidental")[0]
    assert glance.startswith("## At a glance")
    assert "3 claims do not reproduce in this build, 2 at the texts' sizes" in glance
    # each claim by its words, linked to its row where the page has one, with what it measured
    # against what it claims, the reason, and the row that checks the reason
    assert (
        '<a href="chapters/03_incidental_polysemanticity.html#claim-law-b">“fails, explained”</a>:'
        " 2 (the claim: 1), in this build. Why: too few steps. Checked by “reproduces”: 1 (the "
        "claim: 1), in this build: holds." in glance
    )
    assert "law.b" not in glance.replace("#claim-law-b", "")  # no claim id a reader must decode
    assert (
        "<strong>unexpected</strong>: “reproduces”: 0.758 (the claim: 1), at the texts' sizes"
        in glance
    )
    assert (
        "“said to fail, reproduces”: 1 (the claim: 1), in this build. Listed as a known" in glance
    )
    failing, contradicted, slips, outside_table = current.split("<table")[1:]
    # each row by its claim's words (its id is under them)
    rows = {row.split("<br>")[0]: row for row in failing.split("<tr><td>")[1:]}
    assert "{cite:t}`lecomte2023incidental`" in current and "Warning" not in current
    assert "too few steps" in rows["fails, explained"] and "#claim-law-b" in failing
    assert "explanation <code>law.a</code>: holds in this build" in rows["fails, explained"]
    # law.a: reproduces here, fails at the texts' sizes, which no row explains: its value shown
    assert "unexpected" in rows["reproduces"] and "0.758" in rows["reproduces"]
    assert "#claims-ledger" in rows["reproduces"]  # no anchor: the ledger
    assert "unexpected" in rows["fails, unexplained"]
    assert "not this" not in failing and "unexpected" in rows["fails, its why not meant for it"]
    assert "recorded only" in failing and "explained in the chapter" in rows["recorded only"]
    assert "unexpected" not in rows["recorded only"]
    assert "said to fail, reproduces" in contradicted and "the old explanation" in contradicted
    assert "said to fail" not in failing
    assert "a wrong 4" in slips and "we keep the 4" in slips
    assert "tiny n" in outside_table and "checked outside" not in failing
    assert "<th>this build</th><th>the texts' sizes</th>" in outside_table
    stale = page(["experiments.polysemantic.law_fit"])
    assert "Warning" in stale and "experiments.polysemantic.law_fit" in stale
    assert "from a stale record" in stale.split("<table")[1]
    assert (
        "<strong>unexpected</strong>: “reproduces”: 0.758 (the claim: 1), at the texts' sizes, "
        "from a stale record" in (stale.split("## Incidental")[0])
    )


def test_at_a_glance_an_explanation_that_fails_is_named_by_its_claim():
    ledger = Ledger("05_persian_rug", "ci")
    ledger.at_most("a.why", "explanation: the screen", "s", measured=2.0, bound=1.0)
    ledger.equal(
        "a.gap", "the gap", "s", expected=1, measured=3, known_failure="a.why", why="screened"
    )
    page = reports.findings(
        {ledger.chapter: ledger.rows}, {ledger.chapter: []}, {}, {ledger.chapter: set()}, {}
    )
    glance = page.split("## The Persian Rug")[0]
    assert (
        "<strong>unexpected</strong>: “the gap”: 3 (the claim: 1), in this build. Said to fail "
        "because screened, but its explanation does not hold: “the screen”: 2 (the claim: ≤ 1), "
        "in this build." in glance
    )
    assert "<a href" not in glance.replace('<a href="chapters/05_persian_rug.html">', "")
    ledger.equal("a.ok", "explanation, directly: holds", "s", expected=1, measured=1)
    ledger.equal("a.kept", "kept", "s", expected=1, measured=2, known_failure="a.ok", why="w")
    summary = reports.ledger_summary({ledger.chapter: ledger.rows}, {})
    assert "- 05_persian_rug: the gap (**unexpected**)" in summary
    assert "- 05_persian_rug: kept (explained: “holds” holds)" in summary


def test_at_a_glance_a_claim_failing_on_both_sides_is_one_item_in_the_chapters_words_now():
    ledger = Ledger("01_linear_autoencoders", "ci")
    ledger.equal("a.why", "explanation, directly", "s", expected=1, measured=1)
    ledger.equal("a.gap", "the gap", "s", expected=1, measured=3, known_failure="a.why", why="≤")
    recorded = [{**row, "why": "<=" if row["why"] else ""} for row in ledger.rows]  # older words
    record = {ledger.chapter: {"parts": [{"sections": None, "rows": recorded}]}}
    page = reports.findings(
        {ledger.chapter: ledger.rows}, {ledger.chapter: []}, record, {ledger.chapter: set()}, {}
    )
    glance = page.split("## Notes on")[0]  # the glance comes before the texts' sections
    assert glance.count("“the gap”") == 1 and "Why: ≤." in glance and "Why: &lt;=" not in glance


def test_a_text_whose_claims_all_reproduce_says_so_in_a_sentence():
    ledger = Ledger("01_linear_autoencoders", "ci")
    ledger.equal("a.one", "holds", "s", expected=1, measured=1)
    page = reports.findings(
        {ledger.chapter: ledger.rows}, {ledger.chapter: []}, {}, {ledger.chapter: set()}, {}
    )
    assert "every claim checked reproduces in this build; the texts' sizes have not been" in page
    assert "0 claims" not in page
    record = {ledger.chapter: {"parts": [{"sections": None, "rows": ledger.rows}]}}
    page = reports.findings(
        {ledger.chapter: ledger.rows}, {ledger.chapter: []}, record, {ledger.chapter: set()}, {}
    )
    assert "every claim checked reproduces, in this build and at the texts' sizes." in page


def test_ledger_rejects_bad_rows():
    ledger = Ledger("x", "ci")
    ledger.equal("a", "c", "s", expected=1, measured=1)
    with pytest.raises(ValueError, match="duplicate"):
        ledger.equal("a", "c", "s", expected=1, measured=1)
    with pytest.raises(TypeError):  # the numbers are named, never positional
        ledger.close_to("b", "c", "s", 1, 1, 0)
    with pytest.raises(ValueError, match="NaN"):
        ledger.equal("b", "c", "s", expected=1, measured=float("nan"))
    with pytest.raises(ValueError, match="tolerance"):
        ledger.close_to("b", "c", "s", expected=1, measured=1, tolerance=-1)


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
    nested = profiles.select("cpu", ci={}, cpu=dict(flow=dict(n=4, grid=dict(m=8))), paper={})
    assert nested.flow.n == 4 and nested.flow.grid.m == 8


@pytest.mark.parametrize("chapter", [linear, relu, polysemantic, hidden_noise, persian_rug])
def test_every_chapter_has_sizes_for_every_profile(chapter):
    for name in profiles.PROFILES:
        chosen = chapter.sizes(name)
        assert chosen.profile == name and len(vars(chosen)) > 2


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
    assert [p.name for p in tmp_path.iterdir()] == [cache.cache_key(_square.uncached)]
    assert cache.cache_key(_square.uncached).startswith(cache.code_key(_square.uncached))
    monkeypatch.setattr(cache, "code_key", lambda func: "changed-code")
    assert _square(3) == 9
    assert calls == [3, 4, 3]


@cache.cached
def _sum_of_squares(xs):
    return sum(_square(x) for x in xs)


def test_a_cached_computation_says_how_long_it_has_run_and_one_inside_it_does_not(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))
    shown = []

    @contextlib.contextmanager
    def elapsed(desc):
        shown.append(desc)
        yield

    monkeypatch.setattr(cache, "elapsed", elapsed)
    assert _sum_of_squares([5, 6]) == 61
    assert shown == ["computing _sum_of_squares"]  # not its _square(5) and _square(6)
    assert _sum_of_squares([5, 6]) == 61 and shown == ["computing _sum_of_squares"]  # read


def test_the_elapsed_line_appears_after_its_delay_counts_and_is_cleared(monkeypatch, capsys):
    monkeypatch.setattr(progress, "progress_enabled", lambda: True)
    with progress.elapsed("computing quick", delay=2.0, every=0.05):
        time.sleep(0.05)
    assert capsys.readouterr().err == ""  # quick work shows nothing
    with progress.elapsed("computing slow", delay=0.1, every=0.05):
        time.sleep(1.6)
    drawn = capsys.readouterr().err.split("\r")
    assert "computing slow: 00:00" in drawn and "computing slow: 00:01" in drawn
    assert drawn[-2].strip() == "" and drawn[-1] == ""  # the line is wiped when it ends
    monkeypatch.setattr(progress, "progress_enabled", lambda: False)
    with progress.elapsed("computing unseen", delay=0, every=0.05):
        time.sleep(0.2)
    assert capsys.readouterr().err == ""


def test_a_cached_function_refuses_a_toycore_object_as_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path))
    with pytest.raises(TypeError, match="plain values.*Ledger"):
        _square([1, Ledger("x", "ci")])
    assert not any(tmp_path.iterdir())


def test_a_row_outside_the_texts_regime_is_shown_and_not_counted():
    ledger = Ledger("99_example", "ci")
    ledger.close_to("a", "holds", "s", expected=1.0, measured=1.0, tolerance=0.1)
    ledger.close_to(
        "b", "few features", "s", expected=1.0, measured=2.0, tolerance=0.1, outside_regime="p·ns 5"
    )
    assert ledger.all_passed and unexpected_verdicts(ledger.rows) == []
    html = LedgerTable(ledger.rows)._repr_html_()
    assert "1 of 1 reproduce; 1 outside the text's regime" in html
    assert "outside the text's regime</span><br><small>(does not hold here; p·ns 5)" in html
    with pytest.raises(ValueError, match="outside the text's regime is not a known failure"):
        ledger.at_most("c", "c", "s", measured=1, bound=0, known_failure="a", outside_regime="x")
    summary = reports.ledger_summary({"99_example": ledger.rows}, {})
    assert "| 2 | 1 | 0 | 1 |" in summary and "did not reproduce" not in summary


def test_this_builds_rows_stand_beside_the_recorded_ones():
    ledger = Ledger("99_example", "ci")
    ledger.close_to("h.ns64", "at 64", "s", expected=1.0, measured=0.9, tolerance=0.05, spread=0.01)
    recorded = [
        {
            **ledger.rows[0],
            "measured": 0.98,
            "passed": True,
            "profile": "paper",
            "note": "3 <seeds>",
        },
        {**ledger.rows[0], "id": "h.ns2048", "claim": "at 2048", "profile": "paper"},
    ]
    html = BesideTable(ledger.rows, recorded, "recorded somewhere")._repr_html_()
    assert "<caption>recorded somewhere</caption>" in html
    at_64, at_2048 = html.split("<tr>")[2:]
    wanted = "<br><small>expected 1 ± 0.05</small></td>"
    assert f"<td>0.9 ± 0.01{wanted}" in at_64 and "does not reproduce" in at_64
    noted = wanted.replace("</td>", "<br><small>3 &lt;seeds&gt;</small></td>")  # the note, escaped
    assert f'<td>0.98 ± 0.01{noted}<td><span style="color:#1a7f37">reproduces' in at_64
    assert at_2048.startswith(
        "<td>at 2048<br><small><code>h.ns2048</code></small></td><td>not in this build</td>"
    )
    assert "id=" not in html
    # a build that ran none of the claims still says which profile it is
    alone = BesideTable([], recorded, "recorded somewhere", profile="cpu")._repr_html_()
    assert "this build (<code>cpu</code>)" in alone and alone.count("not in this build") == 2
    # a value that four digits would print as its bound gets the digits that tell them apart
    ledger.at_least("h.bound", "just above", "s", measured=1.0004061, bound=1)
    assert "<td>1.0004<br><small>expected ≥ 1" in BesideTable(ledger.rows, [], "")._repr_html_()
    assert "<td>1.0004</td>" in ledger.table("h.bound")._repr_html_()
    # a section's own table of its claims carries their anchors, as Ledger.table's does,
    # for the claims this build ran and those only the record holds
    anchored = BesideTable(ledger.rows, recorded, "recorded", anchors=True)._repr_html_()
    assert '<tr id="claim-h-ns64">' in anchored and '<tr id="claim-h-ns2048">' in anchored


def test_a_tolerance_from_the_seeds_is_the_half_width_of_their_t_interval():
    # mean 2, standard deviation 1, three seeds: t(0.975, 2) = 4.303 standard errors;
    # a seed that gave no value is left out: 1 and 3, one standard error, t(0.975, 1) = 12.706
    assert seed_tolerance([1.0, 2.0, 3.0]) == pytest.approx(4.303 / 3**0.5, rel=1e-3)
    assert seed_tolerance([1.0, float("nan"), 3.0]) == pytest.approx(12.706, rel=1e-3)
    assert seed_tolerance([1.0, float("nan")]) == float("inf")  # one seed: spread unknown


def test_a_claim_stands_alone_with_the_head_of_the_one_it_continues():
    rows = [
        dict(id="a", claim="trained models lose what the rug loses (ns → ∞): at 64"),
        dict(id="b", claim="... and what an actual rug loses: at 64"),
        dict(id="c", claim="the drop starts around p: largest gap"),
    ]
    assert claim_in_full(rows[1], rows) == (
        "trained models lose what the rug loses ... and what an actual rug loses: at 64"
    )
    assert claim_in_full(rows[2], rows) == rows[2]["claim"]
    assert claim_in_full(rows[1], rows[1:]) == rows[1]["claim"]  # nothing before it
    recorded = dict(rows[0], claim="trained models lose what the rug loses: at 2048")
    assert recorded_as(recorded, rows[0]["claim"]) == (
        "<small>recorded as: “trained models lose what the rug loses: at 2048”</small><br>"
    )
    assert recorded_as(rows[0], rows[0]["claim"]) == ""
    reworded = dict(rows[0], claim="trained models lose what the rug loses (ns → ∞), at 64")
    assert recorded_as(reworded, rows[0]["claim"]) == ""  # the same numbers: read as it is now
    ledger = Ledger("99_example", "ci")
    ledger.close_to("h.rug", "a rug at ns = 64", "s", expected=1, measured=1, tolerance=0.1)
    there = dict(ledger.rows[0], claim="a rug at ns = 8192", profile="paper")
    beside = BesideTable(ledger.rows, [there], "recorded")._repr_html_()
    assert "<td>a rug at ns = 64<br><small><code>h.rug</code></small></td>" in beside
    assert "recorded as: “a rug at ns = 8192”" in beside
    alone = BesideTable([], [there], "recorded")._repr_html_()  # under its own words
    assert "<td>a rug at ns = 8192<br>" in alone and "recorded as" not in alone


def test_at_a_glance_a_claim_failing_on_both_sides_shows_both_values():
    ledger = Ledger("03_incidental_polysemanticity", "ci")
    ledger.equal("law.a", "the reason", "s", expected=1, measured=1)
    ledger.equal(
        "law.b", "the claim", "s", expected=1, measured=2, known_failure="law.a", why="few steps"
    )
    recorded = [dict(row, part=0) for row in ledger.rows]
    recorded[1]["measured"] = 3
    record = {"parts": [{"sections": None, "rows": recorded}]}
    page = reports.findings(
        {ledger.chapter: ledger.rows}, {ledger.chapter: []}, {ledger.chapter: record}, {}, {}
    )
    glance = page.split("## Incidental")[0]
    assert (
        "“the claim”: 2 (the claim: 1), in this build; 3 (the claim: 1), at the texts' sizes. "
        "Why: few steps. Checked by “the reason”: 1 (the claim: 1), in this build; 1 (the claim: "
        "1), at the texts' sizes: holds." in glance
    )
