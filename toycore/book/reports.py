"""The reports made from the chapters' claims ledgers and the paper records: the intro's
summary and its claim-by-claim comparison with the texts' sizes, and the findings page."""

import html
import json
import re

from ..claims import (
    anchor,
    claim_in_full,
    expected_to_fail,
    explanation,
    id_line,
    outside,
    recorded_as,
)
from ..dependencies import describe_sections
from ..records import holds_every_section, rows_of, run_sections, runs

LEDGER_MARKER = "<!-- claims-ledger -->"
PAPER_MARKER = "<!-- paper-ledger -->"
FINDINGS_MARKER = "<!-- findings -->"
# The text each chapter follows (its title and bibliography key), for the findings page.
TEXTS = {
    "01_linear_autoencoders": (
        "Notes on the mathematics of toy autoencoding problems",
        "notes_toy_autoencoding",
    ),
    "02_relu_output_model": ("Toy Models of Superposition", "elhage2022superposition"),
    "03_incidental_polysemanticity": ("Incidental polysemanticity", "lecomte2023incidental"),
    "04_sparsity_from_noise": ("Incidental polysemanticity", "lecomte2023incidental"),
    "05_persian_rug": ("The Persian Rug", "persianrug2024"),
}
LEDGER_ANCHOR = "claims-ledger"  # the id of each chapter's "## Claims ledger" heading
# How an explanation's claim begins ("explanation: ", "explanation, directly: "), which a
# sentence that names it as one leaves out.
EXPLANATION_PREFIX = re.compile(r"^explanation[^:]*:\s*")


def ledger_summary(ledgers, titles):
    """The intro page's table of every chapter's claims ledger, linking to each chapter's table."""
    lines = [
        "| chapter | profile | claims | reproduce | do not reproduce | outside the text's regime "
        "| ledger |",
        "|---|---|---|---|---|---|---|",
    ]
    failing = []
    for stem, rows in ledgers.items():
        tested = [row for row in rows if not outside(row)]
        passed = sum(row["passed"] for row in tested)
        profiles = ", ".join(sorted({row["profile"] for row in rows}))
        page = f"chapters/{stem}.ipynb"
        lines.append(
            f"| [{titles.get(stem, stem)}]({page}) | `{profiles}` | {len(rows)} | {passed} "
            f"| {len(tested) - passed} | {len(rows) - len(tested)} "
            f"| [table]({page}#{LEDGER_ANCHOR}) |"
        )
        failing += [
            f"- {titles.get(stem, stem)}: {claim_in_full(row, rows)}" + _explained(row, rows)
            for row in tested
            if not row["passed"]
        ]
    if failing:
        lines += ["", "Claims that did not reproduce in this build:", ""] + failing
    return "\n".join(lines)


def _explained(row, rows):
    """After a failing claim in the intro's list: whether its explanation holds, by its words."""
    if not expected_to_fail(row, rows):
        return " (**unexpected**)"
    found, _ = explanation(row, rows)
    if found is None:  # recorded before rows named their explanation
        return " (explained in the chapter)"
    words = EXPLANATION_PREFIX.sub("", claim_in_full(found, rows))
    return f" (explained: “{words}” holds)"


def verdict_words(row, rows=()):
    """A row's verdict in words, as the chapters' tables give it (HTML): "not run" for a claim
    a record does not hold; a failure says whether it is expected (a known failure whose
    explanation holds among ``rows``, its chapter's or its record's), a known failure that
    reproduces says so."""
    if row is None:
        return "not run"
    if outside(row):
        return "outside the text's regime"
    if row["passed"]:
        if row.get("known_failure"):
            return "reproduces, <strong>unexpected</strong>: listed as a known failure"
        return "reproduces"
    words = "<strong>does not reproduce</strong>"
    return words + (
        " (explained)" if expected_to_fail(row, rows) else ", <strong>unexpected</strong>"
    )


def _stale_sentence(changed, sections=""):
    """One sentence on a stale record (``sections``: of the record's which): what changed since
    it was made."""
    which = f" of {sections}" if sections else ""
    return (
        f"The record{which} is stale: since it was made, this changed: "
        f"{html.escape(', '.join(changed))}."
    )


def _chapters_at_once(count):
    """ "one chapter at a time", "2 chapters at a time"."""
    return "one chapter at a time" if count == 1 else f"{count} chapters at a time"


def _reproduce(held, tested):
    """ "1 of 1 reproduces", "3 of 5 reproduce"."""
    return f"{held} of {tested} " + ("reproduces" if held == 1 else "reproduce")


def _from_cache_sentence(read):
    """What a run read from the result cache (``from_cache``), in words."""
    count = read["results"]
    said = f"It read {count} result{'s' if count > 1 else ''} from the result cache"
    if read["unknown"] == count:
        return f"{said}, computed by earlier runs whose time was not kept."
    unknown = f" ({read['unknown']} of them with no time kept)" if read["unknown"] else ""
    return (
        f"{said}, which earlier runs took {read['computed_s'] / 60:.1f} min to "
        f"compute{unknown}: that time is not in the time above."
    )


def paper_comparison(ledgers, recorded, titles, stale):
    """The intro's claim-by-claim table: this build's verdict beside the paper profile's
    recorded one, with where and when each part of the record was made. ``recorded``:
    {chapter: record} (``toycore.records.load``); ``stale``: {chapter: what changed since each
    of its parts was made, empty when current} (``toycore.records.stale_parts``)."""
    lines = []
    for stem in list(ledgers) + [stem for stem in recorded if stem not in ledgers]:
        rows = {row["id"]: row for row in ledgers.get(stem, [])}
        record = recorded.get(stem)
        paper = {row["id"]: row for row in rows_of(record)} if record else {}
        lines += [f"### [{titles.get(stem, stem)}](chapters/{stem}.ipynb)", ""]
        if record is None:
            lines.append("The paper profile has not been run for this chapter yet.")
        partial = bool(record) and not holds_every_section(record)
        parts = record["parts"] if record else []
        for run in runs(parts):
            given = parts[run[0]]["provenance"]
            changes = " with uncommitted changes" if given["uncommitted_changes"] else ""
            made = [row for k in run for row in parts[k]["rows"]]
            tested = [row for row in made if not outside(row)]
            sections = run_sections([parts[k] for k in run])
            held = f", {describe_sections(sections)}," if sections is not None else ""
            lines.append(
                f"Paper profile{held} recorded {given['recorded']} on {given['device']} "
                f"(`{given['device_type']}`), torch {given['torch']}, commit "
                f"`{given['commit'][:10]}`{changes}, in {given['wall_time_s'] / 60:.1f} min "
                f"({_chapters_at_once(given['chapters_at_once'])}): "
                f"{_reproduce(sum(row['passed'] for row in tested), len(tested))}"
                + (
                    f", {len(made) - len(tested)} outside the text's regime."
                    if len(tested) < len(made)
                    else "."
                )
            )
            read = given.get("from_cache")
            if read and read["results"]:
                lines.append(" " + _from_cache_sentence(read))
            firsts = {}  # each earlier run that first computed values of this run's parts
            for k in run:
                first = parts[k]["provenance"].get("first_run")
                if first:
                    firsts.setdefault(json.dumps(first, sort_keys=True), []).append(k)
            for first, which in firsts.items():
                first = json.loads(first)
                held = (
                    f" of {describe_sections(run_sections([parts[k] for k in which]))}"
                    if len(which) < len(run)
                    else ""
                )
                changes = " with uncommitted changes" if first["uncommitted_changes"] else ""
                read = first.get("from_cache", {}).get("results")
                read = f" and read {read} results from the result cache" if read else ""
                lines.append(
                    f" Its values{held} are identical to those of an earlier run (commit "
                    f"`{first['commit'][:10]}`{changes}, recorded {first['recorded']} on "
                    f"{first['device']}; that run took {first['wall_time_s'] / 60:.1f} "
                    f"min{read}), so the time above may be that of reading them from the result "
                    f"cache."
                )
            for k in run:
                if stale.get(stem) and stale[stem][k]:
                    held = describe_sections(parts[k]["sections"]) if len(run) > 1 else ""
                    lines.append(" " + _stale_sentence(stale[stem][k], held))
        if partial:
            lines.append(
                " The other rows have not been run at the texts' sizes (**not run** below)."
            )
        build_profile = next(iter(rows.values()))["profile"] if rows else "?"
        table = [
            '<table class="paper-comparison"><tr><th>claim</th>'
            f"<th>this build (<code>{build_profile}</code>)</th><th>paper profile</th></tr>"
        ]
        for claim_id in list(rows) + [k for k in paper if k not in rows]:
            row = rows.get(claim_id) or paper[claim_id]
            here = (
                verdict_words(rows[claim_id], ledgers[stem])
                if claim_id in rows
                else "not in this build"
            )
            there = (
                verdict_words(paper[claim_id], list(paper.values()))
                if claim_id in paper
                else "not run"
                if record is None or partial
                else "not recorded"
            )
            recorded_words = recorded_as(paper[claim_id], row["claim"]) if claim_id in paper else ""
            if recorded_words:
                recorded_words = "<br>" + recorded_words.removesuffix("<br>")
            table.append(
                f"<tr><td>{html.escape(row['claim'])}{id_line(claim_id)}{recorded_words}</td>"
                f"<td>{here}</td>"
                f"<td>{there}</td></tr>"
            )
        lines += ["", "".join(table) + "</table>", ""]
    return "\n".join(lines)


def _chapter(stem):
    """ "chapter 3" for ``03_incidental_polysemanticity``."""
    return f"chapter {int(stem.split('_')[0])}"


def _link(stem, row_anchors, claim_id):
    """A link to a claim's row in its section's table, else to the chapter's ledger."""
    target = anchor(claim_id) if anchor(claim_id) in row_anchors else LEDGER_ANCHOR
    return f'<a href="chapters/{stem}.html#{target}">{_chapter(stem)}</a>'


def _value(row):
    """What a row measured, against what the claim expects, in a few characters."""
    measured = f"{row['measured']:.4g}"
    if row.get("spread") is not None:
        measured += f" ± {row['spread']:.2g}"
    bound = {"le": "≤ ", "ge": "≥ "}.get(row["compare"], "")
    tolerance = (
        f" ± {row['tolerance']:.3g}" + (" relative" if row["compare"] == "rel" else "")
        if row["compare"] in ("abs", "rel") and row["tolerance"]
        else ""
    )
    return f"{measured} (the claim: {bound}{row['expected']:.4g}{tolerance})"


def _side(row, rows, stale=False, missing="not run"):
    """One side's cell in the findings table: the verdict, the value, and a warning when it
    comes from a stale record. ``rows``: that side's rows (the build's or the record's);
    ``missing``: what the cell says where that side lacks the claim."""
    if row is None:
        return missing
    words = f"{verdict_words(row, rows)}: {html.escape(_value(row))}"
    if stale:
        words += " <em>(from a stale record)</em>"
    return words


SIDES = ("in this build", "at the texts' sizes")


def _failure_why(sides):
    """The explanation of a failing claim, from ``sides`` ((row, that side's rows, which side)
    triples): the ``why`` of a side where it is a known failure, with its explanation row and
    that row's verdict and value there, saying which side; a failure that no side expects is
    unexpected."""
    for row, rows, where in sides:
        if outside(row) or row["passed"] or not row.get("known_failure"):
            continue
        why = html.escape(row.get("why") or "explained in the chapter")
        if "explained_by" not in row:  # recorded before rows named their explanation
            return why
        found, holds = explanation(row, rows)
        name = f"<code>{html.escape(row['explained_by'])}</code>"
        if holds:
            return f"{why} (explanation {name}: holds {where}, {html.escape(_value(found))})"
        said = f"fails {where}, {html.escape(_value(found))}" if found else f"not run {where}"
        return f"<strong>unexpected</strong>: {why}, but its explanation {name} {said}"
    return "<strong>unexpected</strong>: not explained yet"


def _quoted(stem, sides, row_anchors, prefix=None):
    """A claim of chapter ``stem`` for a sentence (HTML), from ``sides``, the (label, row,
    rows) of each side it is shown on: its words in full (``claim_in_full``, the last side's)
    in quotes, less what ``prefix`` (a pattern) matches at their start, linked to its row in its
    section's table where the page has one, then on each side what it measured against what it
    claims, and which side ``label`` names."""
    _, row, rows = sides[-1]
    claim = claim_in_full(row, rows)
    claim = prefix.sub("", claim) if prefix else claim
    words = f"“{html.escape(claim)}”"
    if anchor(row["id"]) in row_anchors:
        words = f'<a href="chapters/{stem}.html#{anchor(row["id"])}">{words}</a>'
    values = "; ".join(f"{html.escape(_value(row))}, {label}" for label, row, _ in sides)
    return f"{words}: {values}"


def _glance_item(stem, words):
    """One item of a text's list at a glance: its chapter, linked, then ``words``."""
    chapter = f'<a href="chapters/{stem}.html">{_chapter(stem).capitalize()}</a>'
    return f"<li>{chapter}: {words}</li>"


def _at_a_glance(name, stems, ledgers, recorded, stale, anchors):
    """One text's summary for the top of the findings page: how many of its claims fail in
    this build and at the texts' sizes (Markdown), then a list (HTML, since claims hold
    characters Markdown reads as markup): each reason a failure is expected, with the claims it
    explains, what each measured against what it claims on each side where it fails (this
    build, the texts' sizes) and the row that checks the reason; then each unexpected failure with
    its value, and its explanation's where it has one. A value from a stale part of a record
    says so. ``anchors``: {chapter: the row anchors its page has}, for links to the rows."""
    groups, unexpected, counted = {}, [], [0, 0]
    for stem in stems:
        here = ledgers[stem]
        there = rows_of(recorded[stem]) if stem in recorded else []
        # the chapter's words as they are now: a record keeps the words it was made with, and
        # an old record's rows lack why
        said = {row["id"]: row.get("why") for row in here}
        old = stale.get(stem) or []
        for side, rows in enumerate((here, there)):
            tested = [row for row in rows if not outside(row)]
            counted[side] += sum(not row["passed"] for row in tested)
            for row in tested:
                label = "in this build"
                if side == 1:
                    label = "at the texts' sizes" + (
                        ", from a stale record" if old and old[row["part"]] else ""
                    )
                expected = expected_to_fail(row, rows)
                if row["passed"] and not row.get("known_failure"):
                    continue
                if not expected or row["passed"]:
                    unexpected.append((stem, label, row, rows))
                    continue
                why = said.get(row["id"]) or row.get("why") or "explained in the chapter"
                # each claim once, with its value on every side where it fails
                groups.setdefault((stem, why), {}).setdefault(row["id"], []).append(
                    (label, row, rows)
                )
    here = f"{counted[0]} claim does not" if counted[0] == 1 else f"{counted[0]} claims do not"
    everything = (
        "every claim checked reproduces, in this build and at the texts' sizes"
        if any(stem in recorded for stem in stems)
        else "every claim checked reproduces in this build; the texts' sizes have not been run"
    )
    lines = [
        f"**{name}**: {everything}."
        if counted == [0, 0]
        else f"**{name}**: {here} reproduce in this build, {counted[1]} at the texts' sizes."
    ]
    # where each claim comes in its chapter: the build's rows in order, a row only the record
    # holds (at sizes this build lacks) where the build's rows of its family ("headline.") come
    order = {}
    for stem in stems:
        there = rows_of(recorded[stem]) if stem in recorded else []
        for row in ledgers[stem] + there:
            family = (stem, row["id"].split(".")[0])
            order.setdefault(family, len(order))
            order.setdefault((stem, row["id"]), (order[family], len(order)))

    def place(stem, claim_ids):
        return min(order[stem, claim_id] for claim_id in claim_ids)

    items = []
    for (stem, why), shown in sorted(groups.items(), key=lambda g: place(g[0][0], g[1])):
        page = anchors.get(stem, ())
        claims = "; ".join(_quoted(stem, sides, page) for sides in shown.values())
        checks = {}  # an explanation shared by several claims is named once, on each side
        for sides in shown.values():
            for label, row, rows in sides:
                found, _ = explanation(row, rows)
                if found:
                    named = checks.setdefault(found["id"], {})
                    named.setdefault(label, (label, found, rows))
        checked = "".join(
            f" Checked by {_quoted(stem, list(named.values()), page, EXPLANATION_PREFIX)}: holds."
            for named in checks.values()
        )
        items.append(_glance_item(stem, f"{claims}. Why: {html.escape(why)}.{checked}"))
    for stem, label, row, rows in sorted(unexpected, key=lambda u: place(u[0], [u[2]["id"]])):
        page = anchors.get(stem, ())
        words = f"<strong>unexpected</strong>: {_quoted(stem, [(label, row, rows)], page)}."
        found, _ = explanation(row, rows)
        if row.get("known_failure") and not row["passed"]:
            because = html.escape(row.get("why") or "")
            verdict = "was not run"
            if found:
                found_words = _quoted(stem, [(label, found, rows)], page, EXPLANATION_PREFIX)
                verdict = f"does not hold: {found_words}"
            words += f" Said to fail because {because}, but its explanation {verdict}."
        elif row["passed"]:
            words += " Listed as a known failure, it reproduces."
        items.append(_glance_item(stem, words))
    if items:
        lines += ["", '<ul class="glance">' + "".join(items) + "</ul>"]
    return lines


def findings(ledgers, corrections, recorded, anchors, stale):
    """The findings page's body, grouped by text: the claims that do not reproduce, in this
    build or at the texts' sizes, each with the one-sentence explanation of a side where the
    chapter expects the failure (a failure no side explains is **unexpected**, with its value);
    the known failures that reproduce after all; the slips in the text that the chapters repair;
    and, apart, the claims checked outside a text's regime. ``corrections``: {chapter: entries}
    (``toycore.claims.load_corrections``); ``anchors``: {chapter: the row anchors its page has}
    (``row_anchors``); ``stale``: {chapter: what changed since its record was made}."""
    texts = {}
    for stem in ledgers:
        texts.setdefault(TEXTS[stem], []).append(stem)
    lines = ["## At a glance", ""]
    for (name, _), stems in texts.items():
        lines += _at_a_glance(name, stems, ledgers, recorded, stale, anchors) + [""]
    for (name, key), stems in texts.items():
        failing, contradicted, repaired, beyond, warnings = [], [], [], [], []
        for stem in stems:
            here = {row["id"]: row for row in ledgers[stem]}
            record = recorded.get(stem)
            there = {row["id"]: row for row in rows_of(record)} if record else {}
            old = stale.get(stem) or []
            for k, changed in enumerate(old):
                if changed:
                    part = describe_sections(record["parts"][k]["sections"])
                    warnings.append(
                        f"{_chapter(stem).capitalize()}'s record at the texts' sizes ({part}) "
                        f"is stale: since it was made, this changed: {', '.join(changed)}. "
                        "Its verdicts below may not be what the code now gives."
                    )
            page = anchors.get(stem, ())
            for claim_id in list(here) + [k for k in there if k not in here]:
                mine, theirs = here.get(claim_id), there.get(claim_id)
                row = mine or theirs
                contexts = (ledgers[stem], rows_of(record) if record else [])
                sides = [
                    (r, rows, where) for r, rows, where in zip((mine, theirs), contexts, SIDES) if r
                ]
                side_rows = contexts[0] if mine else contexts[1]
                start = (
                    f"<tr><td>{html.escape(claim_in_full(row, side_rows))}{id_line(claim_id)}</td>"
                    f"<td>{_link(stem, page, claim_id)}</td>"
                )
                stale_row = bool(theirs and old and old[theirs["part"]])
                recorded_words = recorded_as(theirs, row["claim"]) if theirs else ""
                cells = (
                    f"<td>{_side(mine, contexts[0], missing='not in this build')}</td>"
                    f"<td>{recorded_words}"
                    f"{_side(theirs, contexts[1], stale_row) if record else 'no record'}"
                    "</td></tr>"
                )
                if any(not outside(r) and not r["passed"] for r, _, _ in sides):
                    failing.append(f"{start}<td>{_failure_why(sides)}</td>{cells}")
                elif any(not outside(r) and r.get("known_failure") for r, _, _ in sides):
                    why = next(r.get("why") for r, _, _ in sides if r.get("known_failure"))
                    contradicted.append(f"{start}<td>{html.escape(why or '')}</td>{cells}")
                elif all(outside(r) for r, _, _ in sides):
                    held = [
                        "not in this build"
                        if r is None
                        else "holds"
                        if r["passed"]
                        else "does not hold"
                        for r in (mine, theirs)
                    ]
                    beyond.append(
                        f"{start}<td>{html.escape(row['outside_regime'])}</td>"
                        f"<td>{held[0]}</td><td>{held[1] if record else 'no record'}</td></tr>"
                    )
            repaired += [
                f"<tr><td>{html.escape(entry['source'])}</td><td>{html.escape(entry['text'])}</td>"
                f"<td>{html.escape(entry['fix'])}</td>"
                f'<td><a href="chapters/{stem}.html">{_chapter(stem)}</a></td></tr>'
                for entry in corrections.get(stem, [])
            ]
        chapters = " and ".join(f"[{_chapter(stem)}](chapters/{stem}.ipynb)" for stem in stems)
        lines += [f"## {name}", "", f"{{cite:t}}`{key}`, checked in {chapters}.", ""]
        lines += [f"**Warning.** {html.escape(warning)}\n" for warning in warnings]
        head = (
            "<tr><th>claim</th><th>chapter</th><th>why</th><th>this build</th>"
            "<th>the texts' sizes</th></tr>"
        )
        if failing:
            lines += [
                '<table class="findings"><caption>Claims that do not reproduce</caption>'
                + head
                + "".join(failing)
                + "</table>",
                "",
            ]
        else:
            lines += ["Every claim of this text that the book checks reproduces.", ""]
        if contradicted:
            lines += [
                '<table class="findings"><caption>Known failures that reproduce after all '
                "(the chapter's explanation needs another look)</caption>"
                + head.replace(">why<", ">the explanation given<")
                + "".join(contradicted)
                + "</table>",
                "",
            ]
        if repaired:
            lines += [
                '<table class="findings"><caption>Slips in the text that the book repairs'
                "</caption><tr><th>where</th><th>the text has</th><th>the book</th>"
                "<th>chapter</th></tr>" + "".join(repaired) + "</table>",
                "",
            ]
        if beyond:
            lines += [
                '<table class="findings"><caption>Checked outside the text\'s regime (not '
                "counted)</caption><tr><th>claim</th><th>chapter</th><th>why outside</th>"
                "<th>this build</th><th>the texts' sizes</th></tr>" + "".join(beyond) + "</table>",
                "",
            ]
    return "\n".join(lines)


def row_anchors(notebook):
    """The claim-row anchors an executed chapter's outputs hold."""
    return set(re.findall(r'id=\\?"(claim-[\w-]+)', notebook.read_text()))
