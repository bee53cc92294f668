"""The budgeted paper run (``make paper-gpu``), end to end on the CPU in the ci profile: it stops
cleanly at its budget, records each part as it finishes, resumes without running again what
is recorded, and packs the records and its log into two files."""

import json
import re
import tarfile
import time

import nbformat
import pytest

from toycore import progress, records
from toycore.book import paper
from toycore.book.config import select_chapters
from toycore.dependencies import Dependencies, claim_sections, section_of_claim

PLAN = (("05_persian_rug", [1]), ("05_persian_rug", [9]))  # the construction; the scaling


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCORE_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("TOYCORE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def run(scratch, budget, plan, name, jobs=1):
    outcomes = paper.run(
        budget,
        scratch / name,
        profile="ci",
        device="cpu",
        plan=plan,
        folder=scratch / "records",
        log=lambda line: None,
        min_start=0,
        jobs=jobs,
    )
    return list(outcomes.values())


def test_a_budgeted_run_stops_at_its_budget_records_what_finished_and_resumes(scratch):
    # a budget shorter than a chapter's start: the part is stopped, nothing is recorded
    stopped = run(scratch, 1.0, PLAN, "first")
    assert stopped[0].startswith("stopped at the budget") and stopped[1].startswith("not started")
    assert not (scratch / "records" / "05_persian_rug.json").exists()
    assert sorted(p.name for p in (scratch / "first").iterdir()) == [
        paper.RECORDS_FILE,
        paper.LOG_FILE,
    ]
    # the first part, recorded the moment it finishes; its shards on two worker processes
    assert run(scratch, 600, PLAN[:1], "second", jobs=2)[0].startswith("recorded in")
    assert "shards on 2 workers" in (scratch / "second" / paper.LOG_FILE).read_text()
    processes = (scratch / "build" / "paper-run-processes.log").read_text()
    assert "--jobs 2" in processes and "a local Dask cluster of 2 workers" in processes
    # again with both: the first is current and not run again; the second is recorded beside it
    resumed = run(scratch, 600, PLAN, "third")
    assert resumed[0] == "already recorded and current" and resumed[1].startswith("recorded in")
    with tarfile.open(scratch / "third" / paper.RECORDS_FILE) as packed:
        (member,) = packed.getmembers()
        record = json.load(packed.extractfile(member))
    assert member.name == "results/paper/05_persian_rug.json" and record["profile"] == "ci"
    assert [part["sections"] for part in record["parts"]] == [[1], [9]]
    ids = [[row["id"] for row in part["rows"]] for part in record["parts"]]
    assert all(i.startswith("construct.") for i in ids[0]) and "scaling.p" in ids[1]
    log = (scratch / "third" / paper.LOG_FILE).read_text()
    assert "profile ci" in log and "section 9: recorded in" in log
    # the log times the part's cells (those of a second or more); a copy older than the part
    # is not read as its
    executed = paper.executed_copy("05_persian_rug")
    timed = paper.cell_times(executed, started=0, shortest=0)
    assert timed and timed[-1].endswith("ledger.save()") and " s  " in timed[0]
    assert paper.cell_times(executed, started=time.time() + 60) == []
    # and what its cells printed, for a failed row's diagnosis
    assert "printed by" in log and paper.printed_lines(executed, started=time.time() + 60) == []
    # each part says what it read from the cache that earlier runs computed: nothing, in these
    # first runs; made again, the second part reads what the third run computed
    assert [part["provenance"]["from_cache"]["results"] for part in record["parts"]] == [0, 0]
    (scratch / "records" / "05_persian_rug.json").unlink()
    assert run(scratch, 600, PLAN[1:], "fourth")[0].startswith("recorded in")
    (again,) = records.load(scratch / "records")["05_persian_rug"]["parts"]
    read = again["provenance"]["from_cache"]
    assert read["results"] > 0 and read["unknown"] == 0, read


def test_the_log_holds_what_a_part_s_cells_printed_and_their_errors(tmp_path):
    notebook = nbformat.v4.new_notebook()
    said = nbformat.v4.new_code_cell("for k in range(3):\n    print(k)")
    said.outputs = [nbformat.v4.new_output("stream", name="stdout", text="0\n1\n2\n")]
    quiet = nbformat.v4.new_code_cell("x = 1")
    failed = nbformat.v4.new_code_cell("1 / 0")
    failed.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
        nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division by zero"),
    ]
    notebook.cells = [said, quiet, failed]
    path = tmp_path / "executed.ipynb"
    nbformat.write(notebook, path)
    assert [line.strip() for line in paper.printed_lines(path, started=0, most=2)] == [
        "printed by  for k in range(3):",
        "0",
        "1",
        "... 1 more lines",
        "printed by  1 / 0",
        "ZeroDivisionError: division by zero",
    ]


def test_a_bad_plan_or_budget_is_refused_before_any_work(scratch):
    with pytest.raises(ValueError, match="no chapter '99'"):
        run(scratch, 10, (("99", None),), "out")
    with pytest.raises(ValueError, match="sections must be a list of numbers"):
        run(scratch, 10, (("05", [0]),), "out")
    with pytest.raises(ValueError, match="budget must be"):
        run(scratch, 0, PLAN, "out")
    with pytest.raises(ValueError, match="jobs must be an integer"):
        run(scratch, 10, PLAN, "out", jobs=0)
    assert not (scratch / "out").exists()


def test_parts_on_the_command_line_replace_the_plan_in_their_order():
    assert paper.parse_parts("05_persian_rug:12 03_incidental_polysemanticity 05:6,7") == (
        ("05_persian_rug", [12]),
        ("03_incidental_polysemanticity", None),
        ("05_persian_rug", [6, 7]),
    )
    for bad, said in (
        ("", "names no part"),
        ("05:a", "section numbers"),
        ("05:", "section numbers"),
        ("99:1", "no chapter"),
    ):
        with pytest.raises(ValueError, match=said):
            paper.parse_parts(bad)


def test_tf32_is_used_only_for_the_chapters_it_was_checked_for(monkeypatch):
    assert paper.precision_for("05_persian_rug", "tf32") == "tf32"
    assert paper.precision_for("03_incidental_polysemanticity", "tf32") == "float32"
    monkeypatch.setenv("TOYCORE_MATMUL", "tf32")
    assert paper.precision_for("05_persian_rug") == "tf32"
    monkeypatch.setenv("TOYCORE_MATMUL", "float32")
    assert paper.precision_for("05_persian_rug") == "float32"


def test_a_part_s_progress_bars_are_logged_finished_or_where_they_stopped(tmp_path, monkeypatch):
    path = tmp_path / "progress.log"
    monkeypatch.setenv("TOYCORE_PROGRESS_LOG", str(path))
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0)  # a line at every update
    finished = progress.progress_bar(3, "three steps")
    for _ in range(3):
        finished.update(1)
    finished.close()
    stopped = progress.progress_bar(100, "a training")  # never closed: its part was stopped
    stopped.update(7)
    said = [line.strip() for line in paper.progress_lines(path, shortest=0)]
    assert [line.split(" after ")[0] for line in said] == [
        "three steps: 3 of 3",
        "a training: 7 of 100",
    ]
    assert said[0].endswith("(done)") and said[1].endswith("(running)")
    # a finished bar shorter than ``shortest`` is left out, an unfinished one never
    assert [line.strip().split(":")[0] for line in paper.progress_lines(path, 60)] == ["a training"]
    assert paper.progress_lines(tmp_path / "none.log") == []
    # work with no steps to count (a cached computation) is logged by its time alone, shown or
    # not: a part stopped inside it says what it was computing
    monkeypatch.setattr(progress, "progress_enabled", lambda: False)
    with progress.elapsed("computing rug_model_losses", every=0.05):
        time.sleep(0.2)
    last = paper.progress_lines(path, shortest=0)[-1].strip()
    assert re.fullmatch(r"computing rug_model_losses: after [0-9.]+ s \(done\)", last), last


def test_the_plan_records_every_section_that_has_rows_once():
    """Each chapter is in the plan whole or as parts that hold each of its sections with ledger
    rows exactly once (a section left out would never be recorded by a lent GPU)."""
    for notebook in select_chapters(None):
        parts = [sections for chapter, sections in paper.PLAN if chapter == notebook.stem]
        if parts == [None]:
            continue
        with_rows = set(records.claimed_sections(notebook.stem))
        planned = [s for sections in parts for s in sections]
        assert sorted(planned) == sorted(set(planned)), notebook.stem  # none twice
        assert with_rows <= set(planned), (notebook.stem, sorted(with_rows - set(planned)))


def test_a_run_runs_only_the_sections_without_a_current_part():
    """An edit that stales one section's part re-runs that section alone, in a plan that names
    the whole chapter or several sections."""
    chapter = "05_persian_rug"

    def part(sections, current=True):
        listed = records.chapter_dependencies(chapter, sections)
        if not current:  # as if recorded before an edit
            listed = Dependencies({**listed.toycore, "toycore.gone": "0"}, listed.cells)
        return dict(
            sections=sections,
            provenance=dict(code=listed.key),
            dependencies=listed.to_json(),
            rows=[dict(profile="paper")],
        )

    claimed = records.claimed_sections(chapter)
    assert claimed[:2] == [1, 3] and 4 in claimed  # section 2 makes no rows
    record = dict(chapter=chapter, parts=[part([1]), part([3], current=False), part([4])])
    assert records.unheld(record, chapter) == [s for s in claimed if s not in (1, 4)]
    assert records.unheld(record, chapter, [1, 3, 4]) == [3]
    assert records.unheld(record, chapter, [4]) == []
    assert records.unheld(None, chapter, [4]) == [4]
    assert records.unheld(record, chapter, [1, 2, 4]) == []  # section 2 makes no rows
    assert records.unheld(dict(parts=[part(None)]), chapter) == []


def test_every_chapter_makes_its_rows_in_numbered_sections():
    """A record holds one part per numbered section (``records.section_parts``): a row made
    in the setup or the ledger's own cells, or by no one section, could not be recorded, and a
    run at the texts' sizes would end without its record."""
    for notebook in select_chapters(None):
        cells = json.loads(notebook.read_text())["cells"]
        made = claim_sections(cells)
        assert made and all(section.isdigit() for _, section in made), notebook.stem
        assert all(section_of_claim(claim, made) for claim, _ in made if not claim.endswith("*"))
        # a variable id or an f-string's start is made in one section only
        for claim in {claim for claim, _ in made if claim.endswith("*")}:
            assert len({s for c, s in made if c == claim}) == 1, (notebook.stem, claim)
