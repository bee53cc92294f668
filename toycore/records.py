"""The paper profile's verdicts, kept with their provenance in ``results/paper/``.

``make book PROFILE=paper`` writes one file per chapter it executed, ``<chapter>.json``::

    {"chapter": "05_persian_rug", "profile": "paper",
     "provenance": {"commit", "uncommitted_changes", "code", "device", "device_type", "torch",
                    "numpy", "scipy", "python", "wall_time_s", "chapters_at_once", "recorded"},
     "rows": [the chapter's ledger rows, as Ledger.save writes them],
     "partial": "sections 1 to 3 of the chapter"}     (only in a partial record)

A partial record (``python -m toycore.book --profile paper --chapters 05 --through 3``) holds the
rows of the chapter's first sections; the intro shows its other rows as not run.

The folder is committed, so the intro page of any build can show, beside its own verdicts, what
the texts' sizes gave, on which machine and when. ``code`` is the hash of the computing code
that the chapter's results depend on (``chapter_code``: the shared modules and the chapter's own
experiments and theory), so an edit to one chapter's code leaves the other chapters' records
current; the intro says when a chapter's code has changed since its record was made.
"""

import datetime
import json
import platform
import subprocess

import numpy
import scipy
import torch

from . import devices
from .cache import code_hash
from .claims import BesideTable
from .paths import REPO_ROOT

FOLDER = REPO_ROOT / "results" / "paper"
# The experiments module each chapter runs (it imports the theory it uses).
CHAPTER_MODULES = {
    "01_linear_autoencoders": "toycore.experiments.linear",
    "02_relu_output_model": "toycore.experiments.relu",
    "03_incidental_polysemanticity": "toycore.experiments.polysemantic",
    "04_sparsity_from_noise": "toycore.experiments.hidden_noise",
    "05_persian_rug": "toycore.experiments.persian_rug",
}
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


def chapter_code(chapter):
    """The hash of the code ``chapter``'s results depend on; a chapter without a module of its
    own in CHAPTER_MODULES depends on every computing module."""
    return code_hash(CHAPTER_MODULES.get(chapter))


def provenance(chapter, device, wall_time_s, chapters_at_once):
    """Where, when and with what ``chapter`` ran: a dict with the keys of PROVENANCE."""
    device = devices.resolve(device)
    changes = _git("status", "--porcelain", "--", "toycore", "chapters")
    return dict(
        commit=_git("rev-parse", "HEAD") or "unknown",
        uncommitted_changes=bool(changes) if changes is not None else None,
        code=chapter_code(chapter),
        device=devices.describe(device),
        device_type=device.type,
        torch=torch.__version__,
        numpy=numpy.__version__,
        scipy=scipy.__version__,
        python=platform.python_version(),
        wall_time_s=round(float(wall_time_s), 1),
        chapters_at_once=int(chapters_at_once),
        recorded=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


# A record made with the same code, device type and libraries, with the same rows, is the same
# run's: a rebuild that found every result in the cache keeps it (see ``recorded_before``).
SAME_RUN = ("code", "device_type", "torch", "numpy", "scipy")


def recorded_before(chapter, rows, provenance, folder=None, partial=None):
    """The existing record of ``chapter`` if it holds these rows (of the same part) from the same
    code, device type and libraries (its date and wall time are then the run that computed
    them), else None."""
    path = (folder or FOLDER) / f"{chapter}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    same = (
        json.dumps(record.get("rows")) == json.dumps(rows)
        and record.get("partial") == partial
        and all(record.get("provenance", {}).get(key) == provenance[key] for key in SAME_RUN)
    )
    return record if same else None


def write(chapter, rows, provenance, folder=None, partial=None):
    """Record one chapter's paper-profile ledger (``partial``: which part of the chapter, for a
    record of its first sections only); returns the file's path."""
    record = dict(chapter=chapter, profile="paper", provenance=provenance, rows=rows)
    if partial:
        record["partial"] = partial
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
    record = load(folder).get(ledger.chapter)
    if record is None:
        return BesideTable(rows, [], "The texts' sizes have not been run for this chapter yet.")
    given = record["provenance"]
    recorded = recorded_rows(ledger.chapter, *prefixes, folder=folder)
    stale = "" if given["code"] == chapter_code(ledger.chapter) else "; the code has changed since"
    source = (
        f"The texts' sizes: recorded {given['recorded']} on {given['device']}, commit "
        f"{given['commit'][:10]}, in {given['wall_time_s'] / 60:.0f} min{stale}."
    )
    return BesideTable(rows, recorded, source)


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
