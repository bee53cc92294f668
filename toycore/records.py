"""The paper profile's verdicts, kept with their provenance in ``results/paper/``.

``make book PROFILE=paper`` writes one file per chapter it executed, ``<chapter>.json``, holding
*parts*, one per section that makes rows (``section_parts``; parts recorded before that rule may
hold several sections, or the whole chapter)::

    {"chapter": "05_persian_rug", "profile": "paper",
     "parts": [{"sections": [1, 2, 3, 5]  (null: the whole chapter),
                "provenance": {"commit", "uncommitted_changes", "code", "device",
                               "device_type", "matmul", "torch", "numpy", "scipy", "python",
                               "wall_time_s", "chapters_at_once", "recorded"},
                "dependencies": {"key", "toycore": {unit: digest}, "cells": [[where, digest]]},
                "rows": [the rows those sections made, as Ledger.save writes them]}]}

``make book PROFILE=paper CHAPTERS=05 SECTIONS=1-3,5`` runs and records sections 1 to 3 and 5
(``toycore.dependencies.cells_for``: with only the statements of other sections that they
need); its parts replace the parts they overlap. A chapter's recorded rows are those of all its
parts; the intro shows the others as not run. Each part lists what its own section's rows
depend on, so an edit stales only the sections it can change, and ``make paper-gpu`` runs only
the sections without a current part.

The folder is committed, so the intro page of any build can show, beside its own verdicts, what
the texts' sizes gave, on which machine and when. A part's ``dependencies`` list exactly the
code its numbers and verdicts depend on (``toycore.dependencies``: the cells that feed its
rows, the toycore functions, classes and constants they run, the verdict logic, the paper
sizes), and ``code`` is their key. A part is stale when, and only when, that code changes
(``staleness`` says what changed): a comment, a figure or another chapter's code leaves it
current.

``python -m toycore.records --split CHAPTER`` splits a part that holds several sections into
one part per section (``split``), each listed from the commit its run was made at.
``python -m toycore.records --carry-over CHAPTER`` gives parts made before records listed
their dependencies the list computed from the commit each was recorded at (a ``git
worktree``): each is then current exactly when that code is the code now.
"""

import argparse
import contextlib
import datetime
import json
import math
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy
import scipy
import torch

from . import cache, devices
from .claims import BesideTable, LedgerTable, not_counted, row_of
from .dependencies import (
    RULE,
    RULES,
    Code,
    Dependencies,
    cells_for,
    changes,
    claim_sections,
    describe_sections,
    notebook_dependencies,
    section_of_claim,
)
from .paths import REPO_ROOT
from .profiles import PROFILES
from .words import id_list

FOLDER = REPO_ROOT / "results" / "paper"
PROVENANCE = (
    "commit",
    "uncommitted_changes",
    "code",
    "device",
    "device_type",
    "torch",
    "numpy",
    "scipy",
    "python",
    "wall_time_s",
    "chapters_at_once",
    "recorded",
)
ROW_KEYS = (
    "id",
    "claim",
    "source",
    "expected",
    "measured",
    "tolerance",
    "compare",
    "passed",
    "known_failure",
    "profile",
    "chapter",
)
# A part made with the same code, device type and libraries, with the same rows, is the same
# run's: a rebuild that found every result in the cache keeps it (``new_parts``).
SAME_RUN = ("code", "device_type", "matmul", "torch", "numpy", "scipy")
# What a row computed, apart from the words of its claim and its reasons (no number is there).
ROW_VALUES = (
    "id",
    "expected",
    "measured",
    "tolerance",
    "compare",
    "passed",
    "spread",
    "note",
    "known_failure",
    "profile",
)
# Of a run's provenance, what says when, where and how long the run that made a part's values
# took (``first_run``), with what it read from the result cache (``from_cache``) where it says.
FIRST_RUN = ("commit", "uncommitted_changes", "recorded", "device", "wall_time_s")


def _git(*args, root=REPO_ROOT):
    try:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def notebook_of(chapter, root=None):
    """The committed notebook of ``chapter``."""
    return (root or REPO_ROOT) / "chapters" / f"{chapter}.ipynb"


def _cells(chapter, root=None):
    """The cells of ``chapter``'s committed notebook under ``root`` (nbformat dicts)."""
    return json.loads(notebook_of(chapter, root).read_text())["cells"]


def chapter_dependencies(chapter, sections=None, code=None, root=None, profile="paper", rule=RULE):
    """What a record of ``chapter``'s ``sections`` (None: all of it) in ``profile`` depends on,
    with ``code`` (default: the toycore this process imported) and the chapter's notebook under
    ``root`` (default: this repository); ``rule``: one of RULES (an earlier one to read a list
    made under it)."""
    code = code or cache.imported_code()
    return notebook_dependencies(
        code, cells_for(_cells(chapter, root), sections, rule), profile, rule
    )


_NOW = {}  # (chapter, sections, profile, the notebook's mtime and size) -> Dependencies


def _dependencies_now(chapter, sections, profile):
    """``chapter_dependencies`` with the code this process imported and the notebook as it is
    on disk, computed once per process: a chapter's tables ask for every part's each time."""
    stat = notebook_of(chapter).stat()
    key = (chapter, sections and tuple(sections), profile, stat.st_mtime_ns, stat.st_size)
    if key not in _NOW:
        _NOW[key] = chapter_dependencies(chapter, sections, profile=profile)
    return _NOW[key]


def staleness(chapter, part, now=None):
    """What changed since ``part`` of ``chapter``'s record was made, in short phrases (empty:
    it is current). ``now``: what it would depend on now (default: computed)."""
    given = part.get("dependencies")
    if not given:
        return ["the record does not list what it depends on"]
    if now is None:
        if not notebook_of(chapter).exists():
            return ["the chapter is gone"]
        now = _dependencies_now(chapter, part["sections"], _profile(part))
    if now.key == given["key"]:
        return []
    return changes(Dependencies.from_json(given), now)


def _profile(part):
    return part["rows"][0]["profile"] if part.get("rows") else "paper"


def stale_parts(recorded):
    """{chapter: [what changed since each part was made]} for every record in ``recorded``
    ({chapter: record}), in the order of its parts."""
    return {
        chapter: [staleness(chapter, part) for part in record["parts"]]
        for chapter, record in recorded.items()
    }


def provenance(chapter, device, wall_time_s, chapters_at_once, code, from_cache=None):
    """Where, when and with what ``chapter`` ran: a dict with the keys of PROVENANCE; ``code``:
    the key of its Dependencies; ``from_cache``: what the run read from the result cache that
    earlier runs computed (``cache.earlier_results``), which its wall time does not include."""
    device = devices.resolve(device)
    changes = _git("status", "--porcelain", "--", "toycore", "chapters")
    return dict(
        commit=_git("rev-parse", "HEAD") or "unknown",
        uncommitted_changes=bool(changes) if changes is not None else None,
        code=code,
        device=devices.describe(device),
        device_type=device.type,
        matmul=devices.matmul_precision(),
        torch=torch.__version__,
        numpy=numpy.__version__,
        scipy=scipy.__version__,
        python=platform.python_version(),
        wall_time_s=round(float(wall_time_s), 1),
        chapters_at_once=int(chapters_at_once),
        recorded=_now(),
        **({"from_cache": from_cache} if from_cache is not None else {}),
    )


def _overlaps(a, b):
    return a is None or b is None or bool(set(a) & set(b))


def by_section(chapter, rows, sections=None, root=None):
    """``rows`` grouped by the section whose cells make them, {section number: rows}, from the
    chapter's notebook under ``root`` (``toycore.dependencies.claim_sections``); a clear error
    for a row that no one section of ``sections`` (None: any) makes."""
    made = claim_sections(_cells(chapter, root))
    groups = {}
    for row in rows:
        section = section_of_claim(row["id"], made)
        if section is None or not section.isdigit() or (sections and int(section) not in sections):
            raise ValueError(
                f"{chapter}: claim {row['id']!r} is not made by one numbered section of "
                f"{describe_sections(sections)}, so its rows cannot be recorded by section"
            )
        groups.setdefault(int(section), []).append(row)
    return dict(sorted(groups.items()))


def claimed_sections(chapter, root=None):
    """The numbered sections of ``chapter``'s notebook whose cells make ledger rows."""
    return sorted({int(s) for _, s in claim_sections(_cells(chapter, root)) if s.isdigit()})


def unheld(record, chapter, sections=None):
    """Which of ``sections`` (None: all) that make rows ``record`` does not hold in current
    parts, in order; [] when it holds them all (a section that makes no rows has no part)."""
    claimed = claimed_sections(chapter)
    wanted = claimed if sections is None else [s for s in sections if s in claimed]
    held = set()
    for part in record["parts"] if record else []:
        if staleness(chapter, part):
            continue
        if part["sections"] is None:
            return []
        held |= set(part["sections"])
    return [section for section in wanted if section not in held]


def section_parts(chapter, rows, provenance, sections=None, code=None, root=None):
    """One part per section for the rows a run of ``chapter``'s ``sections`` (None: all) made,
    each listing what its own section depends on (``chapter_dependencies``, with ``code`` and
    the notebook under ``root``), so that an edit stales only the sections whose rows it can
    change. ``provenance``: the run's, each part's ``code`` its own key."""
    profile = rows[0]["profile"] if rows else "paper"
    parts = []
    for section, held in by_section(chapter, rows, sections, root).items():
        dependencies = chapter_dependencies(chapter, [section], code, root, profile)
        parts.append(
            dict(
                sections=[section],
                provenance={**provenance, "code": dependencies.key},
                dependencies=dependencies.to_json(),
                rows=held,
            )
        )
    return parts


def new_parts(chapter, parts, folder=None):
    """Those of ``parts`` (``section_parts``) that ``chapter``'s record does not already hold:
    a held part has the same sections and rows from the same code, device type and libraries,
    and keeps the date and wall time of the run that computed them (a rebuild served from the
    result cache, or sections an edit elsewhere left as they were)."""
    record = load(folder).get(chapter)
    held = record["parts"] if record else []
    return [
        part
        for part in parts
        if not any(
            old["sections"] == part["sections"]
            and json.dumps(old["rows"]) == json.dumps(part["rows"])
            and all(old["provenance"].get(key) == part["provenance"][key] for key in SAME_RUN)
            for old in held
        )
    ]


def _values(rows):
    return json.dumps([[row.get(key) for key in ROW_VALUES] for row in rows])


def _gives_values_of(part, old):
    """Whether ``old`` (a part before ``part``) holds ``part``'s sections, and rows with the
    same values by the same ids, made on the same device type, precision and libraries."""
    if old.get("sections") is not None and (
        part.get("sections") is None or not set(part["sections"]) <= set(old["sections"])
    ):
        return False
    theirs = {row["id"]: row for row in old["rows"]}
    ours = part["rows"]
    return (
        all(row["id"] in theirs for row in ours)
        and _values([theirs[row["id"]] for row in ours]) == _values(ours)
        and all(
            old["provenance"].get(key) == part["provenance"].get(key)
            for key in SAME_RUN
            if key != "code"
        )
    )


def carry_first_run(parts, held):
    """Give each of ``parts`` whose values a part in ``held`` gave before it (``_gives_values_
    of``) in a run that took longer, that run as its ``first_run``: the commit, date, device
    and wall time of the run that first computed those values. A part made again after an edit
    that moved no number reads its results from the cache in seconds, where its values took
    that run minutes or hours."""
    for part in parts:
        for old in held:
            if _gives_values_of(part, old):
                given = old["provenance"]
                first = given.get("first_run") or {
                    key: given[key] for key in (*FIRST_RUN, "from_cache") if key in given
                }
                if _is_first_run(first, part["provenance"]):  # else check() says what is wrong
                    part["provenance"]["first_run"] = first
                break
    return parts


def write_parts(chapter, parts, folder=None):
    """Put ``parts`` into ``chapter``'s record in place of the parts they overlap, each that
    gives the values of one it replaces keeping the run that first made them
    (``carry_first_run``). Returns the file's path."""
    path = (folder or FOLDER) / f"{chapter}.json"
    profile = parts[0]["rows"][0]["profile"] if parts and parts[0]["rows"] else "paper"
    record = load(folder).get(chapter) or dict(chapter=chapter, profile=profile, parts=[])
    held = record["parts"]
    kept = [
        old for old in held if not any(_overlaps(old["sections"], p["sections"]) for p in parts)
    ]
    record["parts"] = sorted(kept + list(parts), key=lambda p: (p["sections"] or [0])[0])
    problems = check(record)
    if problems:
        raise ValueError(f"not a record of {chapter}: {'; '.join(problems)}")
    carry_first_run(parts, held)  # on parts known well formed; what it adds, it has checked
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def rows_of(record):
    """Every row a record holds, from all its parts, each with ``part``: its part's index."""
    return [{**row, "part": k} for k, part in enumerate(record["parts"]) for row in part["rows"]]


def recorded_rows(chapter, *prefixes, folder=None):
    """The rows of ``chapter``'s paper record whose ids start with ``prefixes`` (all of them
    without prefixes; none without a record)."""
    record = load(folder).get(chapter)
    rows = rows_of(record) if record else []
    return [row for row in rows if row["id"].startswith(prefixes)] if prefixes else rows


def recorded_devices(chapter, folder=None):
    """The device each of ``chapter``'s recorded rows was recorded on: {claim id: device}."""
    record = load(folder).get(chapter)
    if not record:
        return {}
    return {
        row["id"]: record["parts"][row["part"]]["provenance"]["device"] for row in rows_of(record)
    }


def value_text(value, spec=".2f"):
    """A measured value as text for prose, ``format(value, spec)``; "none" where a row had
    nothing to measure (an infinite or NaN value, as a minimum over no cases)."""
    return format(value, spec) if math.isfinite(value) else "none"


def recorded_row(chapter, claim_id, folder=None):
    """The row ``claim_id`` of ``chapter``'s paper record, or None."""
    return row_of(recorded_rows(chapter, folder=folder), claim_id)


def recorded_text(chapter, claim_id, spec=".2f", folder=None):
    """A recorded row's measured value as text, for prose that speaks of the texts' sizes
    (``value_text``), or "not yet recorded"."""
    row = recorded_row(chapter, claim_id, folder)
    return value_text(row["measured"], spec) if row else "not yet recorded"


def held(row):
    """Whether a row's claim held, in words for prose: "holds" or "does not hold"."""
    return "holds" if row["passed"] else "does not hold"


def all_held(rows):
    """Whether several rows' claims held, in words for prose: "all hold", or "do not all hold
    (a and b do not)"."""
    failed = [row["id"] for row in rows if not row["passed"]]
    if not failed:
        return "all hold"
    return f"do not all hold ({id_list(failed)} {'does' if len(failed) == 1 else 'do'} not)"


def verdict_text(row):
    """``held`` of a row, said to be uncounted where the row is outside the text's regime; "is
    not yet recorded" for a record's missing row (None)."""
    if row is None:
        return "is not yet recorded"
    return held(row) + not_counted(row)


def unlabelled_failure_words(row):
    """For prose after a row's known-failure label: where a record's row (None: not recorded)
    fails without that label, a clause saying so (the record was made before the label); else
    ""."""
    if row is None or row["passed"] or row.get("known_failure") or row.get("outside_regime"):
        return ""
    return "; the recorded row, made before that label, shows as an unexpected failure"


def wording_words(recorded, current):
    """For prose after a recorded verdict: where the record's claim (``recorded``, a row or
    None) is worded otherwise than this build's (``current``), a clause quoting it; else ""."""
    if recorded is None or recorded["claim"] == current["claim"]:
        return ""
    return f" (the record tested an earlier wording: “{recorded['claim']}”)"


def recorded_held(chapter, claim_id, folder=None):
    """``verdict_text`` of a recorded row: "is not yet recorded" where there is none."""
    return verdict_text(recorded_row(chapter, claim_id, folder))


def beside(ledger, *prefixes, folder=None, anchors=False):
    """The rows of ``ledger`` whose ids start with ``prefixes``, beside the same claims in its
    chapter's paper record (``claims.BesideTable``, which a notebook displays); ``anchors``:
    this is the section's table of these claims, where the findings page links them."""
    rows = [row for row in ledger.rows if row["id"].startswith(prefixes)]
    everything = recorded_rows(ledger.chapter, folder=folder)
    recorded = [row for row in everything if row["id"].startswith(prefixes)]
    contexts = (ledger.rows, everything)
    return BesideTable(
        rows,
        recorded,
        status(ledger.chapter, folder, _sections_making(ledger.chapter, rows + recorded)),
        contexts,
        profile=ledger.profile,
        anchors=anchors,
    )


def runs(parts):
    """The indices of ``parts`` grouped by the run that made them (the same commit, date,
    device and wall time: the parts a run of several sections was split into), in order."""
    groups = {}
    for k, part in enumerate(parts):
        given = part["provenance"]
        key = (given["commit"], given["recorded"], given["device"], given["wall_time_s"])
        groups.setdefault(key, []).append(k)
    return list(groups.values())


def run_sections(parts):
    """The sections a run's ``parts`` hold together: None if one holds the whole chapter."""
    if any(part["sections"] is None for part in parts):
        return None
    return sorted(set().union(*(part["sections"] for part in parts)))


def holds_every_section(record):
    """Whether ``record``'s parts hold the whole chapter: a part of it all, or parts for every
    section whose cells make rows in the chapter's notebook."""
    if run_sections(record["parts"]) is None:
        return True
    if not notebook_of(record["chapter"]).exists():
        return False
    return set(claimed_sections(record["chapter"])) <= set(run_sections(record["parts"]))


def run_line(parts, changed):
    """One sentence on a run's ``parts``: which sections, where and when, and whether current;
    then one on each stale part, what changed (``changed``: per part, empty when current)."""
    given = parts[0]["provenance"]
    stale = [(part, c) for part, c in zip(parts, changed) if c]
    state = "current" if not stale else "stale in part" if len(stale) < len(parts) else "stale"
    lines = [
        f"{describe_sections(run_sections(parts)).capitalize()} recorded {given['recorded']} on "
        f"{given['device']}, commit {given['commit'][:10]}; {state}."
    ]
    lines += [
        f"{describe_sections(part['sections']).capitalize()}: since it was made, this changed: "
        f"{', '.join(c)}."
        for part, c in stale
    ]
    return " ".join(lines)


def _sections_making(chapter, rows):
    """The numbered sections of ``chapter`` whose cells make ``rows``, or None where the
    notebook does not say (then a table speaks of the whole record)."""
    if not notebook_of(chapter).exists():
        return None
    made = claim_sections(_cells(chapter))
    found = {section_of_claim(row["id"], made) for row in rows}
    numbered = sorted(int(section) for section in found if section and section.isdigit())
    return numbered or None


def status(chapter, folder=None, sections=None):
    """Where ``chapter``'s paper record stands, run by run (``run_line``), or that there is
    none; of its ``sections`` only, where given (a section's table)."""
    record = load(folder).get(chapter)
    if record is None:
        return "The texts' sizes (paper profile) have not been run for this chapter yet."
    parts = [part for part in record["parts"] if _overlaps(part["sections"], sections)]
    if not parts:
        which = describe_sections(sections)
        return f"The texts' sizes (paper profile) have not been run for {which} yet."
    changed = [staleness(chapter, part) for part in parts]
    lines = [run_line([parts[k] for k in run], [changed[k] for k in run]) for run in runs(parts)]
    if not any(changed):  # with a stale part, its own sentence says what changed
        lines.append("None of the code their rows depend on has changed since they were made.")
    return "The texts' sizes (paper profile): " + " ".join(lines)


def ledger_table(ledger, folder=None):
    """``ledger``'s whole table, with a line on its chapter's paper record (``status``)."""
    return LedgerTable(ledger.rows, note=status(ledger.chapter, folder))


def load(folder=None):
    """Every recorded chapter: {chapter: record}."""
    folder = folder or FOLDER
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def check(record):
    """What is wrong with a record's format (an empty list when nothing is)."""
    if not isinstance(record, dict):
        return ["a record is a JSON object"]
    problems = []
    chapter = record.get("chapter")
    if not isinstance(chapter, str) or not chapter:
        problems.append("no chapter name")
    profile = record.get("profile")
    if profile not in PROFILES:
        problems.append(f"profile is {profile!r}, not one of {', '.join(PROFILES)}")
    parts = record.get("parts")
    if not isinstance(parts, list) or not parts:
        return problems + ["no parts"]
    ids = []
    for k, part in enumerate(parts):
        where = f"part {k + 1}"
        if not isinstance(part, dict):
            problems.append(f"{where} is not an object")
            continue
        sections = part.get("sections")
        if sections is not None and not (
            isinstance(sections, list)
            and sections
            and all(isinstance(s, int) and s >= 1 for s in sections)
            and sections == sorted(set(sections))
        ):
            problems.append(f"{where}'s sections are not a sorted list of section numbers")
        if any(_overlaps(sections, other.get("sections")) for other in parts[k + 1 :]):
            problems.append(f"{where} overlaps another part")
        problems += [f"{where}: {problem}" for problem in _check_part(part, chapter, profile)]
        ids += [row.get("id") for row in part.get("rows") or [] if isinstance(row, dict)]
    if len(set(ids)) != len(ids):
        problems.append("a claim id appears twice")
    return problems


def _is_from_cache(read):
    """Whether ``read`` is a ``from_cache`` (``cache.earlier_results``)."""
    return (
        isinstance(read, dict)
        and set(read) == {"results", "computed_s", "unknown"}
        and all(type(read[key]) is int for key in ("results", "unknown"))
        and 0 <= read["unknown"] <= read["results"]
        and isinstance(read["computed_s"], (int, float))
        and read["computed_s"] >= 0
    )


def _is_first_run(first, given):
    """Whether ``first`` is a ``first_run`` for a part whose provenance is ``given``."""
    return (
        isinstance(first, dict)
        and set(first) - {"from_cache"} == set(FIRST_RUN)
        and ("from_cache" not in first or _is_from_cache(first["from_cache"]))
        and all(isinstance(first[key], str) for key in ("commit", "recorded", "device"))
        and isinstance(first["wall_time_s"], (int, float))
        and isinstance(given.get("wall_time_s"), (int, float))
        and first["wall_time_s"] > given["wall_time_s"]
    )


def _check_part(part, chapter, profile):
    problems = []
    given = part.get("provenance")
    if not isinstance(given, dict):
        problems.append("no provenance")
    else:
        problems += [f"provenance lacks {key!r}" for key in PROVENANCE if key not in given]
        if not isinstance(given.get("wall_time_s"), (int, float)) or given["wall_time_s"] < 0:
            problems.append("provenance's wall_time_s is not a time in seconds")
        if given.get("device_type") not in ("cpu", "cuda"):
            problems.append(f"provenance's device_type is {given.get('device_type')!r}")
        if "from_cache" in given and not _is_from_cache(given["from_cache"]):
            problems.append(
                "provenance's from_cache is not a count of results, their computing time and "
                "how many lack one"
            )
        if "first_run" in given and not _is_first_run(given["first_run"], given):
            problems.append(
                f"provenance's first_run is not the {', '.join(FIRST_RUN)} of a longer run"
            )
    depends = part.get("dependencies")
    if not isinstance(depends, dict) or not {"key", "toycore", "cells"} <= set(depends):
        problems.append("no dependencies (what its numbers depend on)")
    elif isinstance(given, dict) and depends["key"] != given.get("code"):
        problems.append("its dependencies' key is not its provenance's code")
    elif Dependencies.from_json(depends).key != depends["key"]:
        problems.append("its dependencies do not hash to their key")
    rows = part.get("rows")
    if not isinstance(rows, list) or not rows:
        return problems + ["no ledger rows"]
    for row in rows:
        if not isinstance(row, dict):
            problems.append("a row is not an object")
            continue
        missing = [key for key in ROW_KEYS if key not in row]
        if missing:
            problems.append(f"row {row.get('id')!r} lacks {', '.join(missing)}")
        elif row["profile"] != profile or row["chapter"] != chapter:
            problems.append(
                f"row {row['id']!r} is from profile {row['profile']!r}, chapter {row['chapter']!r}"
            )
        elif not isinstance(row["passed"], bool):
            problems.append(f"row {row['id']!r} has no verdict")
    return problems


def _old_sections(record):
    """The sections of a record in the form before parts: "sections 1 to 3 of the chapter"."""
    found = re.fullmatch(r"sections 1 to (\d+) of the chapter", record.get("partial") or "")
    return list(range(1, int(found[1]) + 1)) if found else None


def carry_over(chapter, folder=None, root=REPO_ROOT, log=print):
    """Give each part of ``chapter``'s record (a record in the form before parts becomes one)
    that does not list what it depends on the list computed from the commit it was recorded at
    (checked out into a ``git worktree``), and the key of that list as its ``code`` (the old
    hash kept as ``code_before``); its verdicts and its commit stay. Returns, per part, what
    changed since (empty: current)."""
    path = (folder or FOLDER) / f"{chapter}.json"
    record = json.loads(path.read_text())
    if "parts" not in record:
        record = dict(
            chapter=record["chapter"],
            profile=record["profile"],
            parts=[
                dict(
                    sections=_old_sections(record),
                    provenance=record["provenance"],
                    dependencies=record.get("dependencies"),
                    rows=record["rows"],
                )
            ],
        )
    now_code = Code.from_folder(root / "toycore")
    changed = []
    for part in record["parts"]:
        given = part["provenance"]
        if not part.get("dependencies"):
            then, _ = _dependencies_at(chapter, part["sections"], given["commit"], root)
            given["code_before"] = given["code"]
            _list(part, then)
        now = chapter_dependencies(chapter, part["sections"], now_code, root=root)
        changed.append(staleness(chapter, part, now))
        log(
            f"{chapter}, {describe_sections(part['sections'])}: "
            + ("current" if not changed[-1] else "stale: " + ", ".join(changed[-1]))
        )
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return changed


def relist(chapter, folder=None, root=REPO_ROOT, log=print):
    """List again, under the key's present rules, what each part of ``chapter``'s record
    depends on, read from the commit it was recorded at; only where that commit's code is what
    the part's list says it ran under one of the RULES: every unit's digest and every cell as
    listed, a profile table compared by its whole entry for the profile (the rule before its
    settings were counted one by one). A part that is current is left as it is, but for the
    values of the literal constants its cells name, where its list lacks them (they are not in
    the key). The verdicts and the commit stay. Returns, per part, what changed since (empty:
    current), or why it was not relisted."""
    path = (folder or FOLDER) / f"{chapter}.json"
    record = json.loads(path.read_text())
    now_code = Code.from_folder(root / "toycore")
    outcomes = []
    for part in record["parts"]:
        profile = _profile(part)
        now = chapter_dependencies(chapter, part["sections"], now_code, root=root, profile=profile)
        refused = _not_relisted(part)
        if not staleness(chapter, part, now):
            outcomes.append([])  # current as listed: nothing to relist
            if now.constants and "constants" not in part["dependencies"]:
                # listed before constants counted by value: their values, outside the key
                part["dependencies"]["constants"] = now.constants
        elif refused:
            outcomes.append([f"not relisted: {refused}"])
        else:
            given, listed = part["provenance"], Dependencies.from_json(part["dependencies"])
            with _worktree(given["commit"], root) as tree:
                code = Code.from_folder(tree / "toycore")
                then, *before = (
                    chapter_dependencies(chapter, part["sections"], code, tree, profile, rule)
                    for rule in reversed(RULES)
                )
            if any(_lists(listed, made, code, profile) for made in (then, *before)):
                given.setdefault("code_before", given["code"])  # the run's own key
                _list(part, then)
                outcomes.append(staleness(chapter, part, now))
            else:
                outcomes.append(["not relisted: the commit's code is not what the part lists"])
        log(
            f"{chapter}, {describe_sections(part['sections'])}: "
            + (", ".join(outcomes[-1]) if outcomes[-1] else "current")
        )
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return outcomes


def _lists(listed, made, code, profile):
    """Whether ``listed`` is what ``made`` (read from ``code``, the commit's) lists: the same
    cells, and each unit's digest as made or, for a profile table, as its whole entry was."""
    if [d for _, d in listed.cells] != [d for _, d in made.cells]:
        return False
    return all(
        listed.toycore.get(name) == made.toycore.get(name)
        or (name in code.units and listed.toycore.get(name) == code.digest(name, profile))
        for name in set(listed.toycore) | set(made.toycore)
    )


def _not_relisted(part):
    """Why ``part`` cannot be relisted, or "": its list must be the one its run made (matching
    the key it was recorded under), and a list read from its commit afterwards proves nothing
    where the run had uncommitted changes."""
    given = part["provenance"]
    if not part.get("dependencies"):
        return "it lists no dependencies (carry it over instead)"
    if part["dependencies"]["key"] != given["code"]:
        return "its list is not the one its key was made from"
    if given.get("uncommitted_changes") and "dependencies_listed" in given:
        return "its list was read from a commit its run had changed"
    return ""


def _list(part, dependencies):
    """Give ``part`` the ``dependencies`` read from its commit's code, saying so; its verdicts
    and its commit stay."""
    given = part["provenance"]
    given["code"] = dependencies.key
    given["dependencies_listed"] = (
        f"{_now()} from commit {given['commit'][:10]}'s code, by a later toycore "
        f"(toycore.dependencies); the verdicts are the run's"
    )
    part["dependencies"] = dependencies.to_json()


@contextlib.contextmanager
def _worktree(commit, root):
    """``commit`` checked out (a ``git worktree``) for the duration: its folder."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(tree), commit],
            cwd=root,
            check=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=root, check=True
            )


def _dependencies_at(chapter, sections, commit, root, profile="paper"):
    """What ``chapter``'s ``sections`` depended on at ``commit``, and that commit's Code."""
    with _worktree(commit, root) as tree:
        code = Code.from_folder(tree / "toycore")
        return chapter_dependencies(chapter, sections, code, root=tree, profile=profile), code


def split(chapter, folder=None, root=REPO_ROOT, log=print):
    """Make each part of ``chapter``'s record that holds more than one section one part per
    section (``section_parts``), each listing what its own section depended on at the commit
    the part was recorded at, so that an edit stales only the sections it can change; only
    where that commit's code is what the part lists (its list, read again from the commit,
    has the part's key). The rows, verdicts and provenance stay the run's. Returns, per part
    of the new record, what changed since (empty: current)."""
    record = load(folder)[chapter]
    profile = record["profile"]
    split_parts = []
    for part in record["parts"]:
        if part["sections"] is not None and len(part["sections"]) == 1:
            continue
        given, pieces = part["provenance"], []
        refused = _not_relisted(part)
        if not refused:
            with _worktree(given["commit"], root) as tree:
                code = Code.from_folder(tree / "toycore")
                then = chapter_dependencies(chapter, part["sections"], code, tree, profile)
                if then.key != given["code"]:
                    refused = "the commit's code is not what the part lists"
                else:
                    try:
                        pieces = section_parts(
                            chapter, part["rows"], given, part["sections"], code, tree
                        )
                    except ValueError as error:
                        refused = str(error)
        if refused:
            log(f"{chapter}, {describe_sections(part['sections'])}: not split: {refused}")
            continue
        for piece in pieces:
            piece["provenance"]["split"] = (
                f"{_now()}: its rows of a run of {describe_sections(part['sections'])}, listed "
                f"with what its section depends on from commit {given['commit'][:10]}'s code "
                f"(toycore.dependencies); the verdicts are the run's"
            )
        split_parts += pieces
    if split_parts:  # each in place of the part it came from
        write_parts(chapter, split_parts, folder)
    record = load(folder)[chapter]
    now_code = Code.from_folder(root / "toycore")
    outcomes = [
        staleness(
            chapter,
            part,
            chapter_dependencies(chapter, part["sections"], now_code, root, profile),
        )
        for part in record["parts"]
    ]
    for part, changed in zip(record["parts"], outcomes):
        log(
            f"{chapter}, {describe_sections(part['sections'])}: "
            + ("current" if not changed else "stale: " + ", ".join(changed))
        )
    return outcomes


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m toycore.records", description="the paper profile's records"
    )
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--carry-over",
        nargs="+",
        metavar="CHAPTER",
        help="list what these records depend on, from the commit each part was recorded at",
    )
    given.add_argument(
        "--split",
        nargs="+",
        metavar="CHAPTER",
        help="make each part that holds several sections one part per section, each listing "
        "what its section depends on, read from the commit it was recorded at",
    )
    given.add_argument(
        "--relist",
        nargs="+",
        metavar="CHAPTER",
        help="list it again under the key's present rules, where the commit's code is what "
        "each part lists",
    )
    args = parser.parse_args(argv)
    known = sorted(path.stem for path in FOLDER.glob("*.json"))
    chosen = []
    for name in args.carry_over or args.relist or args.split:  # a name or number, as make book
        matches = [stem for stem in known if name in (stem, stem.split("_")[0])]
        if not matches:
            parser.error(f"no record of {name!r}; the records are {', '.join(known)}")
        chosen += matches
    for chapter in chosen:
        (carry_over if args.carry_over else relist if args.relist else split)(chapter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
