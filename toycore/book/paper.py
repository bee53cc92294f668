"""The texts' sizes on a machine lent for minutes: one budgeted command (``make paper-gpu``).

    python -m toycore.book.paper --budget 480 --out DIR

runs, within ``--budget`` seconds of wall time, the parts of the paper profile that have no
current record, the most valuable first (``PLAN``): each part in a process of its own
(``python -m toycore.book --chapters C --sections S``), which records it the moment it
finishes. At the budget it stops the part in flight (its finished shards stay in the result
cache; its rows are not recorded) and starts no other. Then it packs what a lent machine sends
back, two files in ``DIR``:

    paper-records.tar.gz   results/paper/<chapter>.json of every chapter in the plan
    paper-run.log          the machine, then one line per part: recorded, already current,
                           stopped at the budget, not started, or failed (and why), and under
                           a part that ran, its cells of a second or more and where it stopped,
                           then its trainings: each finished one's steps and seconds, and how
                           far an unfinished one had got (its other cached computations by
                           their time alone), then what its cells printed (a
                           failed row's diagnosis, where no GPU is at hand to run it again)

Unpack the tarball at the repository's root (``tar xzf DIR/paper-records.tar.gz``) and commit
the records. Run again, it resumes: what was recorded is current and is not run again.

A machine without the book's execution stack (papermill, nbclient, ipykernel, ipywidgets and
what they need) gets it as wheels: ``python -m toycore.book.paper --wheels .whl`` downloads,
where pip reaches PyPI, those the GPU machines' Python lacks (``PROVIDED``), for its Python
(``--python-version``, default 3.12); ``make paper-gpu`` installs them there before it runs.
"""

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import torch

from .. import devices, records
from ..dependencies import describe_sections
from ..paths import REPO_ROOT, build_dir
from ..profiles import resolve_profile
from .config import select_chapters
from .execute import check_jobs

# The parts of the book at the texts' sizes, the most valuable that a lent GPU finishes first:
# the headline past the texts' sizes (the texts' sweep again, then three models at ns = 4096;
# some minutes, an estimate), then chapter 5's grids, which have never run at those sizes (a CPU
# would take days; on a GPU, ns = 2048 alone is about 13 minutes by an estimate, more than a
# lent GPU's budget), then what reads them, then the rest. The stopping rule's test goes with
# the headline's sweep, whose early models it trains on from where they stopped: a CPU records
# the two in about an hour.
PLAN = (
    ("05_persian_rug", [11]),  # the headline past the texts' sizes (ours)
    # Figure 2's grids with Figures 4 to 7 and the variance bound, which need only the grids
    # (about 9 minutes on an H200 with TF32), so a lease's first call can record them; then
    # Figure 2 itself, from the same trainings in the result cache, plus the actual rugs at
    # ns = 8192 and two fixed-length runs of 100,000 steps
    ("05_persian_rug", [6, 7]),
    ("05_persian_rug", [4]),
    # chapter 3's sections 6 to 8, which read Figure 3's sweep (every feature's winner followed
    # in time): 9,558 s of computing on two CPU cores (a shard of 16 models took 70 s at m = 256
    # and 11 minutes at m = 2304), a minute or two on a GPU by an estimate
    ("03_incidental_polysemanticity", [6, 7, 8]),
    # the text's largest size, ns = 8192, never run: three models of the headline's recipe, a
    # shard each (some 10 ms a step for three at once on an H200 with TF32; their steps are
    # not measured, ns = 4096 took 7,470 to 9,810), so likely one call
    ("05_persian_rug", [13]),
    # the macroscopic loss: section 8 reads the grids and the headline's sweep too, so they
    # train again: two calls on an H200 (540 s stopped by the budget, then 93 s). It comes
    # after section 13 because a record of it exists: a re-record moves a label, not a size
    ("05_persian_rug", [8]),
    # Figure 3 at ns = 512 and the other nd/ns its caption allows: the headline sweep and
    # three models at ns = 512 (a CPU records it from the sweep's cache in seconds; the sweep
    # took some 100 CPU-minutes, about 90 s on an H100)
    ("05_persian_rug", [5]),
    # its scaling and the exact linear baseline, which need neither: a CPU records them
    ("05_persian_rug", [9, 10]),
    # the construction, the headline sweep, Figure 3, the stopping rule (ours)
    ("05_persian_rug", [1, 2, 3, 12]),
    ("03_incidental_polysemanticity", [1, 2, 3, 4, 5, 9]),
    ("02_relu_output_model", None),
    ("01_linear_autoencoders", None),
    ("04_sparsity_from_noise", None),
)
# The chapters whose products may run in TF32 when the run asks for it (TOYCORE_MATMUL=tf32):
# those for which benchmarks/tf32_verdicts.py found no verdict moving. The others run in float32.
TF32_CHAPTERS = ("05_persian_rug",)
# A part is not started with less time left than this: a chapter's kernel alone takes seconds.
MIN_START_S = 30
# After the budget, how long a stopped part may take to end (its kernel is killed) before it is
# killed outright.
STOP_GRACE_S = 30
RECORDS_FILE, LOG_FILE = "paper-records.tar.gz", "paper-run.log"
PROGRESS_FILE = "paper-run-progress.log"  # in the build folder, the running part's bars
# The Python packages the GPU machines' image provides, which the wheels leave out (its list
# does not hold platformdirs, which jupyter_core needs: a run there stopped without it).
PROVIDED = frozenset(
    """attrs certifi charset-normalizer click cloudpickle contourpy cycler filelock fonttools
    fsspec idna jinja2 joblib jaxtyping kiwisolver markupsafe matplotlib msgpack networkx numpy
    packaging pillow pip psutil pygments pyparsing python-dateutil pyyaml requests
    scipy setuptools six sympy toolz torch tqdm typing-extensions urllib3 wadler-lindig wheel
    mpmath triton""".split()
)
# What the book's execution needs beyond toycore's own dependencies, pinned in requirements.txt.
EXECUTION_STACK = ("papermill", "nbformat", "ipykernel", "ipywidgets")


def parse_parts(text):
    """A plan from the command line: parts separated by spaces, each ``chapter`` (the whole
    chapter, by its name or number) or ``chapter:s,t`` (those sections), run in the order
    given; chapters by their full names, as the records and the plan name them."""
    plan = []
    for part in text.split():
        chapter, colon, sections = part.partition(":")
        try:
            numbers = [int(s) for s in sections.split(",")] if colon else None
        except ValueError:
            said = f"{part}: a part is chapter or chapter:s,t (section numbers)"
            raise ValueError(said) from None
        (notebook,) = select_chapters([chapter])
        plan.append((notebook.stem, numbers))
    if not plan:
        raise ValueError("--parts names no part")
    check_plan(plan)
    return tuple(plan)


def check_plan(plan):
    """The plan's chapters must exist and its sections be lists of numbers: a clear error
    before any work."""
    for chapter, sections in plan:
        select_chapters([chapter])
        if sections is not None and not (
            sections and all(isinstance(s, int) and s >= 1 for s in sections)
        ):
            raise ValueError(f"{chapter}: sections must be a list of numbers; got {sections!r}")


def run(
    budget,
    out,
    profile="paper",
    device=None,
    plan=PLAN,
    folder=None,
    log=print,
    min_start=MIN_START_S,
    jobs=1,
):
    """Run ``plan``'s parts that ``folder``'s records (default: ``results/paper``) do not hold
    current, within ``budget`` seconds, none started with less than ``min_start`` left, then
    pack the records and the log into ``out``. ``jobs`` > 1: each part's shards go to that many
    worker processes, which share the device (on a GPU, so that one shard's kernels run while
    another's are being launched). Returns the outcome of each part:
    {"chapter, sections": outcome}."""
    start = time.monotonic()
    if not budget > 0:
        raise ValueError(f"budget must be a number of seconds > 0; got {budget!r}")
    profile = resolve_profile(profile)
    device = devices.resolve(device)  # a missing GPU stops here
    jobs = check_jobs(jobs, device)
    check_plan(plan)
    folder = Path(folder or records.FOLDER)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = start + budget
    lines = [
        f"{devices.describe(device)} ({device.type}), torch {torch.__version__}, profile "
        f"{profile}, budget {budget:.0f} s" + (f", shards on {jobs} workers" if jobs > 1 else "")
    ]
    outcomes = {}
    process_log = Path(build_dir()) / "paper-run-processes.log"
    progress_log = process_log.with_name(PROGRESS_FILE)
    process_log.parent.mkdir(parents=True, exist_ok=True)
    for chapter, planned in plan:
        name = f"{chapter}, {describe_sections(planned)}"
        record = records.load(folder).get(chapter)
        # only the sections without a current part run: an edit re-runs what it staled
        sections = records.unheld(record, chapter, planned)
        if planned is None and sections == records.claimed_sections(chapter):
            sections = None  # nothing held: the whole chapter
        if sections == []:
            outcome = "already recorded and current"
        elif deadline - time.monotonic() < min_start:
            outcome = f"not started: {max(0, deadline - time.monotonic()):.0f} s left"
        else:
            began = time.time()
            progress_log.unlink(missing_ok=True)
            outcome = _run_part(
                chapter,
                sections,
                profile,
                device,
                jobs,
                folder,
                deadline,
                process_log,
                progress_log,
                log,
            )
        outcomes[name] = outcome
        lines.append(f"{name}: {outcome}")
        log(lines[-1])
        if outcome.startswith(("recorded", "stopped", "failed")):
            lines.extend(cell_times(executed_copy(chapter), started=began))
            lines.extend(progress_lines(progress_log))
            lines.extend(printed_lines(executed_copy(chapter), started=began))
    lines.append(f"total {time.monotonic() - start:.0f} s")
    (out / LOG_FILE).write_text("\n".join(lines) + "\n")
    with tarfile.open(out / RECORDS_FILE, "w:gz") as packed:
        for chapter in dict.fromkeys(chapter for chapter, _ in plan):
            path = folder / f"{chapter}.json"
            if path.exists():
                packed.add(path, arcname=str(Path("results") / "paper" / path.name))
    log(f"packed into {out / RECORDS_FILE} and {out / LOG_FILE}")
    return outcomes


def executed_copy(chapter):
    """Where a part's run leaves its executed notebook (the book's source tree in the build)."""
    return Path(build_dir()) / "source" / "chapters" / f"{chapter}.ipynb"


def _part_cells(executed, started):
    """The cells of a part's ``executed`` copy; none if it cannot be read, or if it predates
    the part (``started``, a time.time()): the part never began."""
    try:
        if executed.stat().st_mtime < started:
            return []
        return nbformat.read(executed, as_version=4).cells
    except (OSError, ValueError):
        return []


def cell_times(executed, started, shortest=1.0):
    """Log lines for the cells of a part's ``executed`` copy that took ``shortest`` seconds or
    more, and the cell it stopped in, with its time so far: what sizes the next run's budget.
    Nothing if the copy predates the part (``started``, a time.time()): it never began."""
    lines = []
    for cell in _part_cells(executed, started):
        timing = cell.metadata.get("papermill", {})
        first = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
        seconds = timing.get("duration")
        if timing.get("status") == "failed" and timing.get("start_time"):
            if seconds is None:  # still running when the part was stopped
                began = datetime.fromisoformat(timing["start_time"])
                if began.tzinfo is None:  # older papermills wrote UTC without saying so
                    began = began.replace(tzinfo=timezone.utc)
                seconds = executed.stat().st_mtime - began.timestamp()
            lines.append(f"    {seconds:7.1f} s  {first}  (stopped here)")
        elif seconds is not None and seconds >= shortest:
            lines.append(f"    {seconds:7.1f} s  {first}")
    return lines


def printed_lines(executed, started, most=40):
    """Log lines for what the cells of a part's ``executed`` copy printed, under each cell's
    first line: at most ``most`` lines a cell (the rest counted), and a failed cell's error.
    Nothing if the copy predates the part (``started``, a time.time())."""
    lines = []
    for cell in _part_cells(executed, started):
        said = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                said.extend(output.get("text", "").splitlines())
            elif output.get("output_type") == "error":
                said.append(f"{output.get('ename')}: {output.get('evalue')}")
        if not said:
            continue
        lines.append(f"    printed by  {cell.source.strip().splitlines()[0][:70]}")
        lines.extend(f"      {line}" for line in said[:most])
        if len(said) > most:
            lines.append(f"      ... {len(said) - most} more lines")
    return lines


def progress_lines(path, shortest=2.0):
    """Log lines for a part's progress bars (toycore.progress writes them to ``path``): each
    finished one that took ``shortest`` seconds or more, and where each unfinished one was last
    seen, in the order they started."""
    try:
        written = path.read_text().splitlines()
    except OSError:
        return []
    last = {}  # bar -> its last line, in the order the bars first wrote
    for line in written:
        label, _, said = line.partition(" ")
        last[label] = said
    kept = []
    for said in last.values():
        seconds = re.search(r"after ([0-9.]+) s \((running|done)\)$", said)
        if seconds and (seconds[2] == "running" or float(seconds[1]) >= shortest):
            kept.append(f"    {said}")
    return kept


def precision_for(chapter, asked=None):
    """The products' precision for ``chapter``'s part: ``asked`` (default ``$TOYCORE_MATMUL``)
    where TF32 was checked for the chapter (``TF32_CHAPTERS``), else float32."""
    asked = asked or devices.matmul_precision()
    return asked if chapter in TF32_CHAPTERS else "float32"


def _run_part(
    chapter, sections, profile, device, jobs, folder, deadline, process_log, progress_log, log
):
    """One part in a process of its own, stopped at ``deadline``: its outcome in words. Its
    output goes to ``process_log``, its progress bars to ``progress_log``."""
    command = [
        sys.executable,
        "-m",
        "toycore.book",
        "--profile",
        profile,
        "--device",
        str(device),
        "--jobs",
        str(jobs),
        "--chapters",
        chapter,
        "--records",
        str(folder),
    ] + (["--sections", ",".join(map(str, sections))] if sections else [])
    precision = precision_for(chapter)
    log(f"{chapter}, {describe_sections(sections)}: running, products in {precision} ...")
    began = time.monotonic()
    with open(process_log, "a") as output:
        output.write(f"\n$ {' '.join(command)}\n")
        output.flush()
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "TOYCORE_MATMUL": precision,
                "TOYCORE_PROGRESS_LOG": str(progress_log),
            },
            start_new_session=True,
            # answer _stop's SIGINT even where this process ignores it (a background job, a
            # test worker): a child inherits an ignored SIGINT, and Python then never raises
            # KeyboardInterrupt, so the part would run on for the grace and could record
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(process)
            return f"stopped at the budget after {time.monotonic() - began:.0f} s, not recorded"
    seconds = time.monotonic() - began
    if code == 0:
        return f"recorded in {seconds:.0f} s"
    said = process_log.read_text().strip().splitlines()[-1:] or ["no output"]
    return f"failed after {seconds:.0f} s (exit {code}): {said[0][:300]}"


def _stop(process):
    """Stop a part's process group as Ctrl-C would (the build kills its kernel and says where it
    stopped), then outright if it does not end within STOP_GRACE_S."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wheels(folder, python_version="3.12", requirements=REPO_ROOT / "requirements.txt"):
    """Download into ``folder`` the wheels of EXECUTION_STACK (at requirements.txt's pins) and of
    what they need, for CPython ``python_version`` on x86-64 Linux, leaving out PROVIDED.
    Returns the wheels' names."""
    pins = dict(
        re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line).groups()
        for line in Path(requirements).read_text().splitlines()
        if re.match(r"[A-Za-z0-9_.-]+==", line)
    )
    missing = [name for name in EXECUTION_STACK if name not in pins]
    if missing:
        raise ValueError(f"requirements.txt pins none of {', '.join(missing)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                "--python-version",
                python_version,
                "--implementation",
                "cp",
                *(option for platform in platforms for option in ("--platform", platform)),
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "any",
                "-d",
                scratch,
                *(f"{name}=={pins[name]}" for name in EXECUTION_STACK),
            ],
            check=True,
        )
        kept = []
        for wheel in sorted(Path(scratch).glob("*.whl")):
            project = wheel.name.split("-")[0].lower().replace("_", "-").replace(".", "-")
            if project not in PROVIDED:
                (folder / wheel.name).write_bytes(wheel.read_bytes())
                kept.append(wheel.name)
    return kept


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m toycore.book.paper",
        description="Run the paper profile's parts that have no current record, within a budget.",
    )
    parser.add_argument("--budget", type=float, help="seconds of wall time for the whole run")
    parser.add_argument("--out", help="the folder for the packed records and the log")
    parser.add_argument("--profile", default="paper", help="paper (default); ci for a test")
    parser.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:k")
    parser.add_argument(
        "--records", default=None, help="the records' folder (default: results/paper)"
    )
    parser.add_argument(
        "--parts",
        default=None,
        help="run these parts instead of the plan, in this order: 'chapter chapter:s,t ...' "
        "(for a budget that the plan's first part would outlast)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="worker processes for each part's shards, sharing the device (default 1)",
    )
    parser.add_argument("--wheels", metavar="FOLDER", help="download the wheels instead")
    parser.add_argument("--python-version", default="3.12", help="the wheels' Python")
    args = parser.parse_args(argv)
    try:
        if args.wheels:
            names = wheels(args.wheels, args.python_version)
            print(f"{len(names)} wheels in {args.wheels}")
            return 0
        if args.budget is None or args.out is None:
            parser.error("--budget and --out are needed (or --wheels)")
        plan = parse_parts(args.parts) if args.parts is not None else PLAN
        run(
            args.budget,
            args.out,
            args.profile,
            args.device,
            plan=plan,
            folder=args.records,
            jobs=args.jobs,
        )
    except ValueError as error:
        print(f"paper run failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
