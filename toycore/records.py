"""The paper profile's verdicts, kept with their provenance in ``results/paper/``.

``make book PROFILE=paper`` writes one file per chapter it executed, ``<chapter>.json``::

    {"chapter": "05_persian_rug", "profile": "paper",
     "provenance": {"commit", "uncommitted_changes", "code", "device", "device_type", "torch",
                    "numpy", "scipy", "python", "wall_time_s", "chapters_at_once", "recorded"},
     "dependencies": {"key", "toycore": {unit: digest}, "cells": [[where, digest]]},
     "rows": [the chapter's ledger rows, as Ledger.save writes them],
     "partial": "sections 1 to 3 of the chapter", "through": 3}     (only in a partial record)

A partial record (``python -m toycore.book --profile paper --chapters 05 --through 3``) holds the
rows of the chapter's first sections; the intro shows its other rows as not run.

The folder is committed, so the intro page of any build can show, beside its own verdicts, what
the texts' sizes gave, on which machine and when. ``dependencies`` lists exactly the code the
record's numbers and verdicts depend on (``toycore.dependencies``: the chapter's cells that feed
its rows, the toycore functions, classes and constants they run, the verdict logic, the paper
sizes), and ``code`` is its key. A record is stale when, and only when, that code changes
(``staleness`` says what changed): a comment, a figure or another chapter's code leaves it
current.

``python -m toycore.records --carry-over`` gives a record made before records listed their
dependencies the list computed from the commit it was recorded at (a ``git worktree``): it is
then current exactly when that code is the code now.
"""

import argparse
import datetime
import json
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
from .claims import BesideTable, LedgerTable
from .dependencies import Code, Dependencies, cells_through, changes, notebook_dependencies
from .paths import REPO_ROOT

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


def _git(*args):
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def notebook_of(chapter, root=None):
    """The committed notebook of ``chapter``."""
    return (root or REPO_ROOT) / "chapters" / f"{chapter}.ipynb"


def through_of(record):
    """The last section a partial record holds (None: the whole chapter). Records made before
    ``through`` was written say it in ``partial`` only."""
    if "through" in record:
        return record["through"]
    found = re.fullmatch(r"sections 1 to (\d+) of the chapter", record.get("partial") or "")
    return int(found[1]) if found else None


def chapter_dependencies(chapter, through=None, code=None, root=None):
    """What a paper record of ``chapter`` (its sections 1 to ``through``, or all) depends on
    with ``code`` (default: the toycore this process imported) and the chapter's notebook
    under ``root`` (default: this repository)."""
    code = code or cache.imported_code()
    cells = json.loads(notebook_of(chapter, root).read_text())["cells"]
    if through is not None:
        cells = cells_through(cells, through)
    return notebook_dependencies(code, cells, "paper")


def staleness(record, now=None):
    """What changed since ``record`` was made, in short phrases (empty: it is current).
    ``now``: its chapter's Dependencies now (default: computed)."""
    given = record.get("dependencies")
    if not given:
        return ["the record does not list what it depends on"]
    if now is None:
        if not notebook_of(record["chapter"]).exists():
            return ["the chapter is gone"]
        now = chapter_dependencies(record["chapter"], through_of(record))
    if now.key == given["key"]:
        return []
    return changes(Dependencies.from_json(given), now)


def stale_chapters(recorded):
    """{chapter: what changed} for every record in ``recorded`` ({chapter: record})."""
    return {chapter: staleness(record) for chapter, record in recorded.items()}


def provenance(chapter, device, wall_time_s, chapters_at_once, code):
    """Where, when and with what ``chapter`` ran: a dict with the keys of PROVENANCE; ``code``:
    the key of its Dependencies."""
    device = devices.resolve(device)
    changes = _git("status", "--porcelain", "--", "toycore", "chapters")
    return dict(
        commit=_git("rev-parse", "HEAD") or "unknown",
        uncommitted_changes=bool(changes) if changes is not None else None,
        code=code,
        device=devices.describe(device),
        device_type=device.type,
        torch=torch.__version__,
        numpy=numpy.__version__,
        scipy=scipy.__version__,
        python=platform.python_version(),
        wall_time_s=round(float(wall_time_s), 1),
        chapters_at_once=int(chapters_at_once),
        recorded=_now(),
    )


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# A record made with the same code, device type and libraries, with the same rows, is the same
# run's: a rebuild that found every result in the cache keeps it (see ``recorded_before``).
SAME_RUN = ("code", "device_type", "torch", "numpy", "scipy")


def partial_name(through):
    """How a record of sections 1 to ``through`` says which part of the chapter it holds."""
    return f"sections 1 to {through} of the chapter"


def recorded_before(chapter, rows, provenance, folder=None, through=None):
    """The existing record of ``chapter`` if it holds these rows (of the same part) from the same
    code, device type and libraries (its date and wall time are then the run that computed
    them), else None."""
    path = (folder or FOLDER) / f"{chapter}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    same = (
        json.dumps(record.get("rows")) == json.dumps(rows)
        and through_of(record) == through
        and all(record.get("provenance", {}).get(key) == provenance[key] for key in SAME_RUN)
    )
    return record if same else None


def write(chapter, rows, provenance, dependencies, folder=None, through=None):
    """Record one chapter's paper-profile ledger with what it depends on (``dependencies``,
    whose key is ``provenance["code"]``); ``through``: the last section, for a record of the
    chapter's first sections only. Returns the file's path."""
    record = dict(
        chapter=chapter,
        profile="paper",
        provenance=provenance,
        dependencies=dependencies.to_json(),
        rows=rows,
    )
    if through is not None:
        record.update(partial=partial_name(through), through=through)
    problems = check(record)
    if problems:
        raise ValueError(f"not a paper-profile record of {chapter}: {'; '.join(problems)}")
    path = (folder or FOLDER) / f"{chapter}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def recorded_rows(chapter, *prefixes, folder=None):
    """The rows of ``chapter``'s paper record whose ids start with ``prefixes`` (none without
    a record)."""
    record = load(folder).get(chapter)
    return [row for row in record["rows"] if row["id"].startswith(prefixes)] if record else []


def beside(ledger, *prefixes, folder=None):
    """The rows of ``ledger`` whose ids start with ``prefixes``, beside the same claims in its
    chapter's paper record (``claims.BesideTable``, which a notebook displays)."""
    rows = [row for row in ledger.rows if row["id"].startswith(prefixes)]
    recorded = recorded_rows(ledger.chapter, *prefixes, folder=folder)
    return BesideTable(rows, recorded, status(ledger.chapter, folder))


def status(chapter, folder=None):
    """One sentence on ``chapter``'s paper record: where and when it was made, and whether it is
    current (what changed since, when it is not), or that there is none."""
    record = load(folder).get(chapter)
    if record is None:
        return "The texts' sizes (paper profile) have not been run for this chapter yet."
    given = record["provenance"]
    held = f", {record['partial']}" if record.get("partial") else ""
    changed = staleness(record)
    state = (
        f"stale: since it was made, this changed: {', '.join(changed)}"
        if changed
        else "current: none of the code its rows depend on has changed since"
    )
    return (
        f"The texts' sizes (paper profile{held}): recorded {given['recorded']} on "
        f"{given['device']}, commit {given['commit'][:10]}; {state}."
    )


def ledger_table(ledger, folder=None):
    """``ledger``'s whole table, with a line on its chapter's paper record (``status``)."""
    return LedgerTable(ledger.rows, note=status(ledger.chapter, folder))


def load(folder=None):
    """Every recorded chapter: {chapter: record}."""
    folder = folder or FOLDER
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def check(record):
    """What is wrong with a record's format (an empty list when nothing is)."""
    problems = []
    if not isinstance(record, dict):
        return ["a record is a JSON object"]
    chapter = record.get("chapter")
    if not isinstance(chapter, str) or not chapter:
        problems.append("no chapter name")
    if record.get("profile") != "paper":
        problems.append(f"profile is {record.get('profile')!r}, not 'paper'")
    given = record.get("provenance")
    if not isinstance(given, dict):
        problems.append("no provenance")
    else:
        problems += [f"provenance lacks {key!r}" for key in PROVENANCE if key not in given]
        if not isinstance(given.get("wall_time_s"), (int, float)) or given["wall_time_s"] < 0:
            problems.append("provenance's wall_time_s is not a time in seconds")
        if given.get("device_type") not in ("cpu", "cuda"):
            problems.append(f"provenance's device_type is {given.get('device_type')!r}")
    if "partial" in record and not (isinstance(record["partial"], str) and record["partial"]):
        problems.append("partial does not say which part of the chapter it holds")
    elif "partial" in record and through_of(record) is None:
        problems.append("partial does not say through which section")
    given_dependencies = record.get("dependencies")
    if not isinstance(given_dependencies, dict) or not {"key", "toycore", "cells"} <= set(
        given_dependencies
    ):
        problems.append("no dependencies (what its numbers depend on)")
    elif isinstance(given, dict) and given_dependencies["key"] != given.get("code"):
        problems.append("its dependencies' key is not its provenance's code")
    elif Dependencies.from_json(given_dependencies).key != given_dependencies["key"]:
        problems.append("its dependencies do not hash to their key")
    rows = record.get("rows")
    if not isinstance(rows, list) or not rows:
        problems.append("no ledger rows")
        return problems
    ids = [row.get("id") for row in rows if isinstance(row, dict)]
    if len(ids) != len(rows):
        problems.append("a row is not an object")
    if len(set(ids)) != len(ids):
        problems.append("a claim id appears twice")
    for row in rows:
        if not isinstance(row, dict):
            continue
        missing = [key for key in ROW_KEYS if key not in row]
        if missing:
            problems.append(f"row {row.get('id')!r} lacks {', '.join(missing)}")
        elif row["profile"] != "paper" or row["chapter"] != chapter:
            problems.append(
                f"row {row['id']!r} is from profile {row['profile']!r}, chapter {row['chapter']!r}"
            )
        elif not isinstance(row["passed"], bool):
            problems.append(f"row {row['id']!r} has no verdict")
    return problems


def carry_over(chapter, folder=None, root=REPO_ROOT, log=print):
    """Give ``chapter``'s record, made before records listed what they depend on, the list
    computed from the commit it was recorded at (checked out into a ``git worktree``), and the
    key of that list as its ``code`` (the old hash kept as ``code_before``). Its verdicts and
    its commit stay. Returns what changed since (empty: the record is current)."""
    path = (folder or FOLDER) / f"{chapter}.json"
    record = json.loads(path.read_text())
    commit = record["provenance"]["commit"]
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(tree), commit],
            cwd=root,
            check=True,
        )
        try:
            then = chapter_dependencies(
                chapter, through_of(record), Code.from_folder(tree / "toycore"), root=tree
            )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=root, check=True
            )
    given = record["provenance"]
    if given.get("code") != then.key:
        given["code_before"] = given["code"]
    given["code"] = then.key
    given["dependencies_listed"] = (
        f"{_now()} from commit {commit[:10]}'s code, by a later toycore "
        f"(toycore.dependencies); the verdicts are the run's"
    )
    record["dependencies"] = then.to_json()
    through = through_of(record)
    if through is not None:
        record["through"] = through
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    now = chapter_dependencies(chapter, through, Code.from_folder(root / "toycore"), root=root)
    changed = staleness(record, now)
    log(f"{chapter}: " + ("current" if not changed else "stale: " + ", ".join(changed)))
    return changed


def main(argv=None):
    parser = argparse.ArgumentParser(description="the paper profile's records")
    parser.add_argument(
        "--carry-over",
        nargs="+",
        metavar="CHAPTER",
        required=True,
        help="list what these records depend on, from the commit each was recorded at",
    )
    args = parser.parse_args(argv)
    known = sorted(path.stem for path in FOLDER.glob("*.json"))
    chosen = []
    for name in args.carry_over:  # a chapter's name or its number, as make book takes them
        matches = [stem for stem in known if name in (stem, stem.split("_")[0])]
        if not matches:
            parser.error(f"no record of {name!r}; the records are {', '.join(known)}")
        chosen += matches
    for chapter in chosen:
        carry_over(chapter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
