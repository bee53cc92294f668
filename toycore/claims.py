"""The claims ledger: every chapter ends with a table of the source's claims and ours.

``Ledger(chapter, profile)`` collects rows, one per claim, each stated in one of four forms
whose verdict is computed from the numbers (never set by hand)::

    ledger.close_to(id, claim, source, expected=..., measured=..., tolerance=...)
    ledger.close_to(..., relative=True)        # |measured - expected| <= tolerance |expected|
    ledger.at_most(id, claim, source, measured=..., bound=...)
    ledger.at_least(id, claim, source, measured=..., bound=...)
    ledger.equal(id, claim, source, expected=..., measured=...)

Each also takes ``spread=``, ``note=`` and ``known_failure=`` (see ``close_to``).
``ledger.save()`` writes ``<build>/claims/<chapter>.json`` (a list of objects with id, claim,
source, expected, measured, tolerance, compare, passed, profile, ...; a bound is stored as
``expected`` with tolerance 0) and ``ledger.table()`` renders the HTML table shown in the
chapter.
"""

import html
import json
import math

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


class Ledger:
    def __init__(self, chapter, profile=None):
        self.chapter, self.profile, self.rows = chapter, resolve_profile(profile), []

    def close_to(
        self, id, claim, source, *, expected, measured, tolerance, relative=False, **details
    ):
        """A claim that ``measured`` is ``expected`` within ``tolerance`` (a fraction of
        ``expected`` when ``relative``). ``details``, taken by every form:

        spread: the standard deviation over seeds, shown next to ``measured`` when given.
        note: what a reader needs to judge the row (sizes, seeds, why it deviates).
        known_failure: the chapter has shown, with its explanation, that this claim does not
            reproduce. The verdict is still computed; the tests flag a known failure that starts
            passing as firmly as a new failure.
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
        known_failure=False,
    ):
        if any(row["id"] == id for row in self.rows):
            raise ValueError(f"duplicate claim id {id!r}")
        expected, measured = _number("expected", expected), _number("measured", measured)
        tolerance = _number("tolerance", tolerance)
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0; got {tolerance}")
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
            profile=self.profile,
            chapter=self.chapter,
        )
        self.rows.append(row)
        return row

    @property
    def all_passed(self):
        return all(row["passed"] for row in self.rows)

    def save(self):
        """Write the rows to ``<build>/claims/<chapter>.json`` and return the path."""
        path = build_dir() / "claims" / f"{self.chapter}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.rows, indent=1))
        return path

    def table(self, *prefixes):
        """The ledger as an HTML table (an object that Jupyter displays); with ``prefixes``,
        only the rows whose id starts with one of them, to show a section's claims where they
        are checked."""
        return LedgerTable([row for row in self.rows if row["id"].startswith(prefixes or "")])


def _format(value):
    return f"{value:.4g}"


class LedgerTable:
    def __init__(self, rows):
        self.rows = rows

    def _repr_html_(self):
        head = (
            "<tr><th>claim</th><th>source</th><th>expected</th><th>ours</th>"
            "<th>tolerance</th><th>verdict</th></tr>"
        )
        body = []
        for r in self.rows:
            measured = _format(r["measured"])
            if r["spread"] is not None:
                measured += f" ± {_format(r['spread'])}"
            verdict = (
                '<span style="color:#1a7f37">reproduces</span>'
                if r["passed"]
                else '<strong style="color:#cf222e">does not reproduce</strong>'
            )
            if r.get("known_failure") and not r["passed"]:
                verdict += "<br><small>(explained in the chapter)</small>"
            note = f"<br><small>{html.escape(r['note'])}</small>" if r["note"] else ""
            _, expected, tolerance = COMPARISONS[r["compare"]]
            if r["compare"] in ("le", "ge"):  # a bound; older records kept a tolerance on it
                shift = r["tolerance"] if r["compare"] == "le" else -r["tolerance"]
                expected = expected.format(e=_format(r["expected"] + shift))
            else:
                expected = expected.format(e=_format(r["expected"]))
            tolerance = tolerance.format(t=r["tolerance"])
            body.append(
                f"<tr><td>{html.escape(r['claim'])}{note}</td><td>{html.escape(r['source'])}</td>"
                f"<td>{expected}</td><td>{measured}</td><td>{tolerance}</td>"
                f"<td>{verdict}</td></tr>"
            )
        passed = sum(r["passed"] for r in self.rows)
        profile = self.rows[0]["profile"] if self.rows else "?"
        caption = (
            f"<caption>Claims ledger: {passed} of {len(self.rows)} reproduce "
            f"(profile <code>{profile}</code>)</caption>"
        )
        return f'<table class="claims-ledger">{caption}{head}{"".join(body)}</table>'


def unexpected_verdicts(rows):
    """The ids of rows whose verdict is not the expected one: every row should reproduce,
    except the known failures, which should not."""
    return [row["id"] for row in rows if row["passed"] == row["known_failure"]]


def load_ledgers(directory=None):
    """Every chapter's saved rows: {chapter: [rows]} from ``<build>/claims/*.json``."""
    directory = directory or build_dir() / "claims"
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
