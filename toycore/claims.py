"""The claims ledger: every chapter ends with a table of the source's claims and ours.

``Ledger(chapter, profile)`` collects rows, one per claim, each stated in one of four forms
whose verdict is computed from the numbers (never set by hand)::

    ledger.close_to(id, claim, source, expected=..., measured=..., tolerance=...)
    ledger.close_to(..., relative=True)        # |measured - expected| <= tolerance |expected|
    ledger.at_most(id, claim, source, measured=..., bound=...)
    ledger.at_least(id, claim, source, measured=..., bound=...)
    ledger.equal(id, claim, source, expected=..., measured=...)

Each also takes ``spread=``, ``note=``, ``known_failure=`` with its ``why=``, and
``outside_regime=`` (see ``close_to``). A row is one of three kinds: a test of the text's claim,
which can fail; a sanity check, true by construction, whose claim says so; or a claim checked
where the text's analysis does not apply, whose ``outside_regime`` says why: its verdict is
computed and shown, but it counts neither as reproduced nor as failed. A row's labels are
decided from sizes and settings, never from its own measured value
(``tests/test_ledger_labels.py`` enforces it).
``seed_tolerance(per_seed)`` is a tolerance from the runs' own seed spread (a t-interval).
``ledger.correction(id, source, text, fix)`` notes a slip in the text that the chapter repairs
(a wrong factor, bound or symbol). ``ledger.save()`` writes ``<build>/claims/<chapter>.json``
(a list of objects with id, claim, source, expected, measured, tolerance, compare, passed,
profile, ...; a bound is stored as ``expected`` with tolerance 0) and the corrections to
``<build>/claims/corrections/<chapter>.json``; ``ledger.table()`` renders the HTML table shown
in the chapter. The book's findings page is made from both.
"""

import html
import json
import math
import re

import numpy as np

from .paths import build_dir
from .profiles import resolve_profile

COMPARISONS = {
    # name: (verdict, the expected column, the tolerance column)
    "abs": (lambda m, e, t: abs(m - e) <= t, "{e}", "± {t:.3g}"),
    "rel": (lambda m, e, t: abs(m - e) <= t * abs(e), "{e}", "± {t:.3g} relative"),
    "le": (lambda m, e, t: m <= e + t, "≤ {e}", "—"),
    "ge": (lambda m, e, t: m >= e - t, "≥ {e}", "—"),
}


def _number(name, value):
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} is NaN")
    return value


def seed_tolerance(per_seed, confidence=0.95):
    """A tolerance from the runs' own seed spread: the half-width of the t-interval of the mean
    of ``per_seed`` (one value per seed; NaNs, seeds that gave no value, left out). Infinite
    with fewer than two values, whose spread is unknown."""
    from scipy import stats

    values = np.asarray(per_seed, dtype=float)
    values = values[~np.isnan(values)]
    if len(values) < 2:
        return math.inf
    half = stats.t.ppf((1 + confidence) / 2, len(values) - 1) / len(values) ** 0.5
    return float(half * values.std(ddof=1))


class Ledger:
    def __init__(self, chapter, profile=None):
        self.chapter, self.profile, self.rows = chapter, resolve_profile(profile), []
        self.corrections = []

    def correction(self, id, source, text, fix):
        """A slip in the text that the chapter repairs: where it is (``source``), what the text
        has (``text``) and, in one sentence, what the chapter uses instead and why (``fix``)."""
        if any(entry["id"] == id for entry in self.corrections):
            raise ValueError(f"duplicate correction id {id!r}")
        entry = dict(id=id, source=source, text=text, fix=fix, chapter=self.chapter)
        self.corrections.append(entry)
        return entry

    def close_to(
        self, id, claim, source, *, expected, measured, tolerance, relative=False, **details
    ):
        """A claim that ``measured`` is ``expected`` within ``tolerance`` (a fraction of
        ``expected`` when ``relative``). ``details``, taken by every form:

        spread: the standard deviation over seeds, shown next to ``measured`` when given.
        note: what a reader needs to judge the row (sizes, seeds, why it deviates).
        known_failure: the id of the row, in the same chapter, that tests why this claim does
            not reproduce (a row that can fail, never a sanity check); None or "": the claim
            should reproduce. The verdict is still computed. The failure is expected only while
            that explanation holds: a known failure whose explanation row fails (or is not
            run), or that reproduces after all, is unexpected (``unexpected_verdicts``).
        why: the explanation in one sentence, for the findings page; required with
            known_failure (given with a conditional known_failure too: it is shown only when
            the row is one).
        outside_regime: why the text's analysis does not apply at these sizes or settings (an
            empty string: it does). Such a row's verdict is computed and shown, not counted.
        """
        compare = "rel" if relative else "abs"
        return self._add(id, claim, source, expected, measured, tolerance, compare, **details)

    def at_most(self, id, claim, source, *, measured, bound, **details):
        """A claim that ``measured`` <= ``bound``."""
        return self._add(id, claim, source, bound, measured, 0.0, "le", **details)

    def at_least(self, id, claim, source, *, measured, bound, **details):
        """A claim that ``measured`` >= ``bound``."""
        return self._add(id, claim, source, bound, measured, 0.0, "ge", **details)

    def equal(self, id, claim, source, *, expected, measured, **details):
        """A claim that ``measured`` is exactly ``expected`` (a count, a rank)."""
        return self._add(id, claim, source, expected, measured, 0.0, "abs", **details)

    def _add(
        self,
        id,
        claim,
        source,
        expected,
        measured,
        tolerance,
        compare,
        *,
        spread=None,
        note="",
        known_failure=None,
        why="",
        outside_regime="",
    ):
        if any(row["id"] == id for row in self.rows):
            raise ValueError(f"duplicate claim id {id!r}")
        expected, measured = _number("expected", expected), _number("measured", measured)
        tolerance = _number("tolerance", tolerance)
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0; got {tolerance}")
        if known_failure not in (None, False, "") and not isinstance(known_failure, str):
            raise ValueError(
                f"{id}: a known failure names the row that tests its explanation "
                f"(known_failure='<row id>'), not {known_failure!r}"
            )
        if known_failure == id:
            raise ValueError(f"{id}: a known failure cannot explain itself")
        if known_failure and outside_regime:
            raise ValueError(f"{id}: a row outside the text's regime is not a known failure")
        if known_failure and not why:
            raise ValueError(f"{id}: a known failure needs why=, its explanation in one sentence")
        row = dict(
            id=id,
            claim=claim,
            source=source,
            expected=expected,
            measured=measured,
            tolerance=tolerance,
            compare=compare,
            passed=bool(COMPARISONS[compare][0](measured, expected, tolerance)),
            spread=None if spread is None else float(spread),
            note=note,
            known_failure=bool(known_failure),
            explained_by=known_failure or "",
            why=str(why),
            outside_regime=str(outside_regime),
            profile=self.profile,
            chapter=self.chapter,
        )
        self.rows.append(row)
        return row

    def row(self, id):
        """The row ``id`` added so far, for prose about its verdict; a clear error if none."""
        row = row_of(self.rows, id)
        if row is None:
            raise KeyError(f"{self.chapter}'s ledger has no row {id!r} yet")
        return row

    @property
    def all_passed(self):
        return all(row["passed"] for row in self.rows if not row["outside_regime"])

    def save(self):
        """Write the rows to ``<build>/claims/<chapter>.json`` and return the path."""
        path, corrections = ledger_files(self.chapter)
        corrections.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.rows, indent=1))
        corrections.write_text(json.dumps(self.corrections, indent=1))
        return path

    def table(self, *prefixes):
        """The ledger as an HTML table (an object that Jupyter displays); with ``prefixes``,
        only the rows whose id starts with one of them, to show a section's claims where they
        are checked."""
        if not prefixes:
            return LedgerTable(self.rows)
        # a section's table holds its rows' anchors (the findings page links to them)
        chosen = [row for row in self.rows if row["id"].startswith(prefixes)]
        return LedgerTable(chosen, True, context=self.rows)


def _format(value):
    return f"{value:.4g}"


def _measured(row):
    """A row's measured value as the tables write it: four significant digits, more where
    four would print it as its expected value or bound (1.0004 against 1 is not "1")."""
    value, expected = row["measured"], row["expected"]
    for digits in range(4, 17):
        text = f"{value:.{digits}g}"
        if value == expected or text != f"{expected:.{digits}g}":
            return text
    return text


def outside(row):
    """Whether a row checks its claim outside the text's regime (rows recorded before the
    label existed are inside it)."""
    return bool(row.get("outside_regime"))


def not_counted(row):
    """For prose after a row's verdict: " (outside the text's regime: not counted)" where the
    row is outside the regime, else ""."""
    return " (outside the text's regime: not counted)" if outside(row) else ""


def row_of(rows, claim_id):
    """The row ``claim_id`` among ``rows`` (a ledger's or a record's), or None."""
    return next((row for row in rows if row["id"] == claim_id), None)


# How a claim that continues the row before it begins ("... and at the grid's sparsest p").
CONTINUATION = "..."


def claim_in_full(row, rows):
    """A claim's words where it stands alone (a list of failures, not its table): one that
    continues the claim before it among ``rows`` (its ledger's or its record's) gets that
    claim's head in front, the words before its first ':' or ' (': "trained models lose what
    the rug loses (ns → ∞) ... and what an actual rug of the same ns loses"."""
    claim = row["claim"]
    if not claim.startswith(CONTINUATION):
        return claim
    before = None
    for other in rows:
        if other["id"] == row["id"]:
            break
        if not other["claim"].startswith(CONTINUATION):
            before = other["claim"]
    if before is None:
        return claim
    head = re.split(r":| \(", before, maxsplit=1)[0]
    return f"{head} {claim}"


def recorded_as(row, shown):
    """For a recorded row shown under the claim words ``shown`` (this build's): its own words,
    where they name other numbers (the sizes it ran at: ns = 2048, not 512), as HTML followed
    by a line break, else nothing; a claim reworded since it was recorded reads as it is now."""
    numbers = re.compile(r"\d+(?:\.\d+)?")
    if shown is None or numbers.findall(row["claim"]) == numbers.findall(shown):
        return ""
    return f"<small>recorded as: “{html.escape(row['claim'])}”</small><br>"


def explanation(row, rows):
    """A known failure's explanation row among ``rows`` (a chapter's, or a record's), and
    whether it holds: (row or None, bool). It holds when it is there, inside the text's regime
    and reproduces."""
    found = row_of(rows, row.get("explained_by"))
    return found, bool(found and not outside(found) and found["passed"])


def expected_to_fail(row, rows):
    """Whether ``row`` should not reproduce: it is a known failure whose explanation holds
    among ``rows``. A known failure recorded before rows named their explanation (no
    ``explained_by``) is taken as expected."""
    if not row.get("known_failure"):
        return False
    if "explained_by" not in row:
        return True
    return explanation(row, rows)[1]


def verdict_html(row, rows=()):
    """A row's verdict as the chapters' tables show it; ``rows``: the chapter's, where a known
    failure's explanation is found."""
    if outside(row):
        held = "holds" if row["passed"] else "does not hold"
        return (
            '<span style="color:#6e7781">outside the text\'s regime</span>'
            f"<br><small>({held} here; {html.escape(row['outside_regime'])})</small>"
        )
    if row["passed"]:
        verdict = '<span style="color:#1a7f37">reproduces</span>'
        if row.get("known_failure"):
            verdict += "<br><small>(unexpected: listed as a known failure)</small>"
        return verdict
    verdict = '<strong style="color:#cf222e">does not reproduce</strong>'
    if row.get("known_failure"):
        found, holds = explanation(row, rows)
        # a link to the explanation's row, where the page has one (a section's own table)
        by = row.get("explained_by") or ""
        name = f'<a href="#{anchor(by)}"><code>{html.escape(by)}</code></a>'
        if "explained_by" not in row:
            verdict += "<br><small>(explained in the chapter)</small>"
        elif holds:
            verdict += f"<br><small>(explained: {name} holds)</small>"
        else:
            state = "fails" if found else "was not run"
            verdict += f"<br><small>(unexpected: its explanation {name} {state})</small>"
    return verdict


def anchor(claim_id):
    """The HTML id of a claim's row in its section's table."""
    return "claim-" + claim_id.replace(".", "-")


def _expected_columns(row):
    """A row's expected value and tolerance as the tables write them, e.g. ("1", "± 0.05")
    or ("≤ 0.1", "—")."""
    _, expected, tolerance = COMPARISONS[row["compare"]]
    if row["compare"] in ("le", "ge"):  # a bound; older records kept a tolerance on it
        shift = row["tolerance"] if row["compare"] == "le" else -row["tolerance"]
        expected = expected.format(e=_format(row["expected"] + shift))
    else:
        expected = expected.format(e=_format(row["expected"]))
    return expected, tolerance.format(t=row["tolerance"])


def _wanted(row):
    """A row's expected value with its tolerance, in one phrase: "1 ± 0.05", "≤ 0.1"."""
    expected, tolerance = _expected_columns(row)
    return expected if tolerance == "—" else f"{expected} {tolerance}"


def _row_id(claim_id):
    return f' id="{anchor(claim_id)}"'


def id_line(claim_id):
    """A claim's id as the tables show it under the claim's words: the name the prose and the
    verdicts give it."""
    return f"<br><small><code>{html.escape(claim_id)}</code></small>"


def _claim_cell(row):
    """A row's claim as a table's first cell shows it, its id under it."""
    return html.escape(row["claim"]) + id_line(row["id"])


class LedgerTable:
    """Rows as the chapters' tables show them; ``anchors``: give each row its HTML id;
    ``note``: a line under the caption (where the texts' sizes stand, ``records.ledger_table``);
    ``context``: the chapter's rows, where known failures' explanations are found (default:
    ``rows``)."""

    def __init__(self, rows, anchors=False, note="", context=None):
        self.rows, self.anchors, self.note = rows, anchors, note
        self.context = rows if context is None else context

    def _repr_html_(self):
        head = (
            "<tr><th>claim</th><th>source</th><th>expected</th><th>ours</th>"
            "<th>tolerance</th><th>verdict</th></tr>"
        )
        body = []
        for r in self.rows:
            measured = _measured(r)
            if r["spread"] is not None:
                measured += f" ± {_format(r['spread'])}"
            verdict = verdict_html(r, self.context)
            note = f"<br><small>{html.escape(r['note'])}</small>" if r["note"] else ""
            expected, tolerance = _expected_columns(r)
            row_id = _row_id(r["id"]) if self.anchors else ""
            body.append(
                f"<tr{row_id}><td>{_claim_cell(r)}{note}</td>"
                f"<td>{html.escape(r['source'])}</td>"
                f"<td>{expected}</td><td>{measured}</td><td>{tolerance}</td>"
                f"<td>{verdict}</td></tr>"
            )
        tested = [r for r in self.rows if not outside(r)]
        passed = sum(r["passed"] for r in tested)
        outside_note = (
            f"; {len(self.rows) - len(tested)} outside the text's regime"
            if len(tested) < len(self.rows)
            else ""
        )
        profile = self.rows[0]["profile"] if self.rows else "?"
        note = f"<br><small>{html.escape(self.note)}</small>" if self.note else ""
        caption = (
            f"<caption>Claims ledger: {passed} of {len(tested)} reproduce{outside_note} "
            f"(profile <code>{profile}</code>){note}</caption>"
        )
        return f'<table class="claims-ledger">{caption}{head}{"".join(body)}</table>'


class BesideTable:
    """This build's rows beside those recorded at the texts' sizes (``toycore.records``): for
    each claim, our value (with its expected value and the row's note) and verdict in each.
    ``recorded``: the paper record's rows (empty when none holds these claims); ``source``: one
    line on where and when they were recorded; ``contexts``: every row of the chapter and of
    its record, where known failures' explanations are found (default: the rows shown);
    ``profile``: this build's (default: its rows' own, which a build that ran none of these
    claims lacks); ``anchors``: give each row its HTML id, as a section's own table of its
    claims does (``Ledger.table``)."""

    def __init__(self, rows, recorded, source, contexts=None, profile=None, anchors=False):
        self.rows, self.recorded, self.source, self.anchors = rows, recorded, source, anchors
        self.contexts = contexts or (rows, recorded)
        self.profile = profile or (rows[0]["profile"] if rows else "?")

    def _cell(self, row, context, missing, shown=None):
        if row is None:
            return f"<td>{missing}</td><td></td>"
        measured = recorded_as(row, shown) + _measured(row)
        if row.get("spread") is not None:
            measured += f" ± {_format(row['spread'])}"
        wanted = f"<br><small>expected {html.escape(_wanted(row))}</small>"
        note = f"<br><small>{html.escape(row['note'])}</small>" if row.get("note") else ""
        return f"<td>{measured}{wanted}{note}</td><td>{verdict_html(row, context)}</td>"

    def _repr_html_(self):
        here = {row["id"]: row for row in self.rows}
        there = {row["id"]: row for row in self.recorded}
        ids = list(here) + [claim_id for claim_id in there if claim_id not in here]
        head = (
            "<tr><th>claim</th>"
            f"<th colspan=2>this build (<code>{self.profile}</code>)</th>"
            "<th colspan=2>the texts' sizes (<code>paper</code>)</th></tr>"
        )
        body = []
        for i in ids:
            row = here.get(i) or there[i]
            shown = row["claim"]
            body.append(
                f"<tr{_row_id(i) if self.anchors else ''}><td>{_claim_cell(row)}</td>"
                f"{self._cell(here.get(i), self.contexts[0], 'not in this build')}"
                f"{self._cell(there.get(i), self.contexts[1], 'not run', shown)}</tr>"
            )
        caption = f"<caption>{html.escape(self.source)}</caption>"
        return f'<table class="claims-ledger">{caption}{head}{"".join(body)}</table>'


def unexpected_verdicts(rows):
    """The ids of rows whose verdict is not the expected one: every row should reproduce,
    except the known failures whose explanation holds (``expected_to_fail``), which should not;
    a row outside the text's regime may do either."""
    return [
        row["id"]
        for row in rows
        if not outside(row)
        and (row["passed"] == expected_to_fail(row, rows) or row["passed"] and row["known_failure"])
    ]


def verdict_groups(rows):
    """A ledger's rows by how their verdicts read, as lists of ids: ``known``, the known
    failures that fail as expected; ``outside``, the rows outside the text's regime;
    ``unexpected``, the rows whose verdict is not the expected one (``unexpected_verdicts``)."""
    unexpected = unexpected_verdicts(rows)
    return dict(
        known=[
            row["id"]
            for row in rows
            if row.get("known_failure") and not outside(row) and row["id"] not in unexpected
        ],
        outside=[row["id"] for row in rows if outside(row)],
        unexpected=unexpected,
    )


def ledger_files(chapter):
    """Where ``chapter``'s ledger is saved: its rows and its corrections, under the build's
    claims/ folder."""
    folder = build_dir() / "claims"
    return folder / f"{chapter}.json", folder / "corrections" / f"{chapter}.json"


def load_ledgers(directory=None):
    """Every chapter's saved rows: {chapter: [rows]} from ``<build>/claims/*.json``."""
    directory = directory or build_dir() / "claims"
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def load_corrections(directory=None):
    """Every chapter's corrections to its text: {chapter: [entries]}."""
    return load_ledgers((directory or build_dir() / "claims") / "corrections")
