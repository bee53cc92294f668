"""What records and cached results depend on (toycore.dependencies): exactly the code their
numbers can depend on. An edit that changes no number keeps every record and result current;
an edit that can change one stales exactly the chapters and results that run it.

The edits are made to a copy of toycore, read statically (nothing is run), and the records
are the book's five chapters and a small probe chapter written here."""

import ast
import json
import shutil
import subprocess

import pytest

from toycore import records
from toycore.cache import PACKAGE
from toycore.dependencies import (
    RULES,
    Code,
    cells_for,
    changes,
    claim_sections,
    notebook_dependencies,
    section_of_claim,
    serialise,
)
from toycore.paths import REPO_ROOT

CHAPTERS = sorted(path.stem for path in (REPO_ROOT / "chapters").glob("*.ipynb"))


def _cell(kind, source):
    return {"cell_type": kind, "source": source, "metadata": {}}


def probe_cells(tolerance="0.05", measured="sweep.loss.mean()", claim="a claim", shown="W"):
    """A small chapter in the book's form, which trains with chapter 5's training code."""
    return [
        _cell("markdown", "# A probe chapter"),
        _cell("code", "profile = None"),
        _cell(
            "code",
            "import numpy as np\n"
            "from toycore.claims import Ledger\n"
            "from toycore.experiments import rug_training as rt\n"
            "from toycore.plots import glue, show\n"
            "from toycore.plots import persian_rug as plots\n"
            'ledger = Ledger("99_probe", profile)',
        ),
        _cell("markdown", "## 1. Training\n\nProse."),
        _cell(
            "code",
            "sweep = rt.train_group(64, [0.05], 16, [0, 1], max_steps=100)\n"
            "print(sweep.loss)  # a display",
        ),
        _cell("code", f"show(plots.weight_block(sweep.{shown}[0], sweep.b[0]))\nglue(x=1)"),
        _cell(
            "code",
            "ledger.close_to(\n"
            f'    "probe.loss", "{claim}", "§1",\n'
            f"    expected=0.01, measured={measured}, tolerance={tolerance},\n"
            '    note=f"{sweep.loss.size} models",\n'
            ")\n"
            'ledger.table("probe.")',
        ),
        _cell("markdown", "## Claims ledger"),
        _cell("code", "ledger.save()\nledger.table()"),
    ]


@pytest.fixture(scope="module")
def original():
    return Code.from_folder(PACKAGE)


def _chapter_key(code, chapter, rule=RULES[-1]):
    """A whole chapter's record key."""
    cells = json.loads((REPO_ROOT / "chapters" / f"{chapter}.ipynb").read_text())["cells"]
    return notebook_dependencies(code, cells, "paper", rule).key


def _keys(code):
    """Every chapter's record key and the probe's."""
    keys = {chapter: _chapter_key(code, chapter) for chapter in CHAPTERS}
    keys["99_probe"] = notebook_dependencies(code, probe_cells(), "paper").key
    return keys


def _cached_functions(code):
    """The qualified names of every @cached function in ``code``."""
    return sorted(
        unit.name
        for unit in code.units.values()
        if unit.kind == "function"
        and any(
            (isinstance(d, ast.Name) and d.id == "cached")
            or (isinstance(d, ast.Call) and getattr(d.func, "id", None) == "cached")
            for d in unit.node.decorator_list
        )
    )


def _result_keys(code):
    return {name: code.function_key(name) for name in _cached_functions(code)}


@pytest.fixture
def copy(tmp_path):
    """A copy of toycore to edit: (folder, edit(relative path, old, new))."""
    folder = tmp_path / "toycore"
    shutil.copytree(PACKAGE, folder, ignore=shutil.ignore_patterns("__pycache__"))

    def edit(relative, old, new):
        path = folder / relative
        text = path.read_text()
        assert old in text, f"{old!r} is not in {relative}"
        path.write_text(text.replace(old, new, 1))

    return folder, edit


def _add_statement(path, function, statement):
    """Add ``statement`` at the start of ``function``'s body in the file ``path`` (written back
    through ast.unparse: its formatting changes too, which counts for nothing)."""
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    node.body.insert(0, ast.parse(statement).body[0])
    path.write_text(ast.unparse(tree))


def _retell(text):
    """``text`` with every docstring reworded, a comment on every line that can hold one and
    its formatting changed (blank lines, a wrapped call), keeping its meaning."""
    tree = ast.parse(text)
    lines = text.splitlines()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            first = body[0].value
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                line = lines[first.lineno - 1]
                quote = line.index('"""', first.col_offset)
                lines[first.lineno - 1] = line[: quote + 3] + "Reworded. " + line[quote + 3 :]
    # a comment after every statement that ends its line (not inside a string)
    ends = {n.end_lineno for n in ast.walk(tree) if isinstance(n, ast.stmt)}
    starts = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.stmt)}
    strings = {
        k
        for n in ast.walk(tree)
        if isinstance(n, (ast.Constant, ast.JoinedStr)) and n.end_lineno > n.lineno
        for k in range(n.lineno, n.end_lineno + 1)
    }
    out = []
    for number, line in enumerate(lines, start=1):
        if number in ends and number not in strings and not line.rstrip().endswith("\\"):
            line += "  # a comment"
        if number in starts and number not in strings and line.strip():
            out.append("")  # a blank line: formatting
        out.append(line)
    return "\n".join(out) + "\n"


def test_a_syntax_tree_is_written_the_same_with_or_without_empty_fields():
    tree = ast.parse("def f(x):\n    return x + 1").body[0]
    with_empty = ast.parse("def f(x):\n    return x + 1").body[0]
    with_empty.type_params = []  # what Python 3.12 adds to every function
    assert serialise(tree) == serialise(with_empty)
    assert serialise(tree) != serialise(ast.parse("def f(x):\n    return x + 2").body[0])


def test_docstrings_comments_and_formatting_anywhere_in_toycore_stale_nothing(copy, original):
    folder, _ = copy
    for path in folder.rglob("*.py"):
        path.write_text(_retell(path.read_text()))
    edited = Code.from_folder(folder)
    assert edited.texts != original.texts  # the edit happened
    assert _keys(edited) == _keys(original)
    assert _result_keys(edited) == _result_keys(original)
    assert len(_result_keys(original)) > 20  # every chapter's cached functions


def test_an_edit_to_chapter_5s_training_stales_its_record_and_results_and_no_others(copy, original):
    folder, _ = copy
    # a function that chapter 5's training calls: the learning rate of the authors' recipe
    _add_statement(
        folder / "experiments" / "rug_training.py", "learning_rate", "features = 2 * features"
    )
    edited = Code.from_folder(folder)
    before, after = _keys(original), _keys(edited)
    stale = sorted(chapter for chapter in before if before[chapter] != after[chapter])
    assert stale == ["05_persian_rug", "99_probe"]
    results_before, results_after = _result_keys(original), _result_keys(edited)
    rekeyed = sorted(name for name in results_before if results_before[name] != results_after[name])
    # both the runs and the runs trained on from where they stopped
    assert rekeyed == [
        "toycore.experiments.rug_training.train_group",
        "toycore.experiments.rug_training.train_on",
    ]
    # and the record says what changed, in a short list
    probe = notebook_dependencies(original, probe_cells(), "paper")
    now = notebook_dependencies(edited, probe_cells(), "paper")
    assert changes(probe, now) == ["experiments.rug_training.learning_rate"]


def test_an_edit_to_a_shared_training_function_stales_the_chapters_that_train_with_it(
    copy, original
):
    folder, _ = copy
    _add_statement(folder / "train.py", "train", "steps = steps + 1")
    before, after = _keys(original), _keys(Code.from_folder(folder))
    stale = sorted(chapter for chapter in before if before[chapter] != after[chapter])
    # chapters 1 to 4 train with train(); chapter 5 (and the probe) with train_until_converged
    assert stale == CHAPTERS[:4]


def test_edits_to_plots_widgets_and_the_build_stale_nothing(copy, original):
    folder, _ = copy
    neutral = [
        *(folder / "plots").glob("*.py"),
        folder / "widgets.py",
        *(folder / "book").glob("*.py"),
        folder / "records.py",
        folder / "paths.py",
        folder / "progress.py",
        folder / "shards.py",
    ]
    for path in neutral:  # a statement added to every function: real code, not a comment
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                node.body.insert(0, ast.parse("_edited = 1").body[0])
        path.write_text(ast.unparse(tree))
    edited = Code.from_folder(folder)
    assert _keys(edited) == _keys(original)
    assert _result_keys(edited) == _result_keys(original)


def test_a_ledger_cell_s_tolerance_or_measured_expression_stales_the_record(original):
    base = notebook_dependencies(original, probe_cells(), "paper")
    tolerance = notebook_dependencies(original, probe_cells(tolerance="0.1"), "paper")
    measured = notebook_dependencies(
        original, probe_cells(measured="np.median(sweep.loss)"), "paper"
    )
    assert base.key != tolerance.key and base.key != measured.key
    assert changes(base, tolerance) == ["the code of §1 cell 3"]
    # words and displays change no verdict: a reworded claim, another figure
    for same in (probe_cells(claim="the claim, reworded"), probe_cells(shown="b")):
        assert notebook_dependencies(original, same, "paper").key == base.key


def test_a_paper_record_counts_only_the_paper_sizes(copy, original):
    folder, _ = copy
    sizes = folder / "sizes.py"
    text = sizes.read_text()
    table = text.index("PERSIAN_RUG = dict(")
    entries = {name: text.index(f"{name}=dict(", table) for name in ("ci", "cpu", "paper")}

    def with_sweep_of(entry, text):  # one more size in that profile's ns sweep
        start = text.index("sweep_sizes=[", entries[entry])
        return text[:start] + "sweep_sizes=[8, " + text[start + len("sweep_sizes=[") :]

    sizes.write_text(with_sweep_of("ci", text))
    assert _keys(Code.from_folder(folder)) == _keys(original)  # no paper record reads ci's
    sizes.write_text(with_sweep_of("paper", text))
    after, before = _keys(Code.from_folder(folder)), _keys(original)
    assert sorted(chapter for chapter in before if before[chapter] != after[chapter]) == [
        "05_persian_rug"
    ]


def test_a_part_counts_only_the_settings_its_code_reads(copy, original):
    """Section 11 alone reads the sizes past the texts' (``P.beyond_sizes``), section 13 alone
    the text's largest: changing either stales its own section's record and leaves the others
    current; a setting that nothing reads stales nothing; the stopping rule's cap, which every
    one of them reads, stales them all."""
    folder, edit = copy
    cells = json.loads((REPO_ROOT / "chapters" / "05_persian_rug.ipynb").read_text())["cells"]
    parts = ([1, 2, 3, 5], [12], [11], [13])

    def keys(code):
        return [notebook_dependencies(code, cells_for(cells, s), "paper").key for s in parts]

    def moved(before, after):
        return [a != b for a, b in zip(after, before)]

    before = keys(original)
    edit("sizes.py", "        beyond_sizes=[4096],", "        beyond_sizes=[4096, 8192],")
    after = keys(Code.from_folder(folder))
    assert moved(before, after) == [False, False, True, False]
    largest = "        text_largest_sizes=[8192],"
    edit("sizes.py", largest, "        text_largest_sizes=[8192, 16384],")
    assert moved(after, keys(Code.from_folder(folder))) == [False, False, False, True]
    after = keys(Code.from_folder(folder))
    last = "        text_largest_seeds=[0, 1, 2],\n    ),\n)"  # the paper entry's end
    edit("sizes.py", last, last.replace("\n    ),", "\n        unread=1,\n    ),"))
    assert keys(Code.from_folder(folder)) == after
    edit("sizes.py", "        max_steps=100_000,", "        max_steps=100_001,")
    assert all(moved(after, keys(Code.from_folder(folder))))


def test_a_part_reads_a_name_its_block_binds_first_from_that_block_alone():
    """``if run: s = f(); g(s)`` reads no earlier s: slicing must not pull in an earlier
    section's cell that also binds s (chapter 5's section 11 once ran Figure 2's grids, all of
    its models, because section 6 binds a slope); a branch that reads s before binding it does
    pull in the earlier s."""
    chosen = "if run:\n    slope = fit(head)\n    print(slope)\n"
    cells = [
        _cell("code", "profile = None"),
        _cell("code", "from toycore.claims import Ledger\nledger = Ledger('99_probe', profile)"),
        _cell("markdown", "## 1. The models"),
        _cell("code", "head = train()\ngrids = train_grids()\nslope = fit(grids)"),
        _cell("markdown", "## 2. The trend"),
        _cell("code", "run = True\n" + chosen),
        _cell("markdown", "## Claims ledger"),
        _cell("code", "ledger.save()"),
    ]
    code = "\n".join(c["source"] for c in cells_for(cells, [2]) if c["cell_type"] == "code")
    assert "head = train()" in code and "train_grids" not in code
    cells[5] = _cell("code", "run = True\n" + chosen + "else:\n    print(slope)\n")
    code = "\n".join(c["source"] for c in cells_for(cells, [2]) if c["cell_type"] == "code")
    assert "slope = fit(grids)" in code and "grids = train_grids()" in code
    # a loop's body likewise, in order: bound before it is read, or read before it is bound
    for body, pulled in (
        ("slope = fit(k)\n    print(slope)", False),
        ("print(slope)\n    slope = fit(k)", True),
    ):
        cells[5] = _cell("code", f"for k in head:\n    {body}\n")
        code = "\n".join(c["source"] for c in cells_for(cells, [2]) if c["cell_type"] == "code")
        assert ("train_grids" in code) == pulled and "head = train()" in code


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _committed_repository(root, chapter, notebook):
    """A repository at ``root`` with toycore and one chapter (``notebook``, a dict), committed:
    the commit's hash."""
    shutil.copytree(PACKAGE, root / "toycore", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "chapters").mkdir()
    (root / "chapters" / f"{chapter}.ipynb").write_text(json.dumps(notebook))
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "recorded")
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()


def test_a_record_made_before_keys_listed_dependencies_is_carried_over(tmp_path):
    """A record without dependencies gets those of the commit it was recorded at: current when
    that code is the code now, stale (saying what changed) when not."""
    root = tmp_path / "repo"
    notebook = {"cells": probe_cells(), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    commit = _committed_repository(root, "99_probe", notebook)
    folder = root / "results" / "paper"
    folder.mkdir(parents=True)
    old = dict(
        chapter="99_probe",
        profile="paper",
        provenance=dict(commit=commit, code="0ld"),
        rows=[],
    )
    (folder / "99_probe.json").write_text(json.dumps(old))
    assert records.carry_over("99_probe", folder, root, log=lambda line: None) == [[]]
    (carried,) = json.loads((folder / "99_probe.json").read_text())["parts"]
    assert (
        carried["provenance"]["commit"] == commit and carried["provenance"]["code_before"] == "0ld"
    )
    assert carried["provenance"]["code"] == carried["dependencies"]["key"]
    # the same record, carried over after the training changed, is stale and says why
    (folder / "99_probe.json").write_text(json.dumps(old))
    training = root / "toycore" / "experiments" / "rug_training.py"
    training.write_text(training.read_text().replace("BATCH = 1024", "BATCH = 512"))
    assert records.carry_over("99_probe", folder, root, log=lambda line: None) == [
        ["experiments.rug_training.BATCH"]
    ]


def test_a_record_listed_under_the_earlier_rule_is_relisted_where_its_code_is_unchanged(tmp_path):
    """A part listed when a profile table counted its whole entry for the profile is listed
    again under the present rule (only the settings read), and is current; one whose listed
    cells are not its commit's is left alone."""
    root, chapter = tmp_path / "repo", "05_persian_rug"
    notebook = json.loads((REPO_ROOT / "chapters" / f"{chapter}.ipynb").read_text())
    commit = _committed_repository(root, chapter, notebook)
    code = Code.from_folder(root / "toycore")
    listed = records.chapter_dependencies(chapter, [12], code, root=root)
    (table,) = [name for name in listed.toycore if name.endswith("sizes.PERSIAN_RUG")]
    earlier = dict(listed.toycore, **{table: code.digest(table, "paper")})
    folder = root / "results" / "paper"
    folder.mkdir(parents=True)

    def record(cells):
        old = records.Dependencies(earlier, cells)
        part = dict(sections=[12], provenance=dict(commit=commit, code=old.key), rows=[])
        part["dependencies"] = old.to_json()
        (folder / f"{chapter}.json").write_text(
            json.dumps(dict(chapter=chapter, profile="paper", parts=[part]))
        )
        return part

    assert records.staleness(chapter, record(listed.cells), listed) == ["sizes.PERSIAN_RUG"]
    assert records.relist(chapter, folder, root, log=lambda line: None) == [[]]
    (part,) = json.loads((folder / f"{chapter}.json").read_text())["parts"]
    assert part["dependencies"]["key"] == listed.key == part["provenance"]["code"]
    record([[where, "0ther"] for where, _ in listed.cells])
    (outcome,) = records.relist(chapter, folder, root, log=lambda line: None)
    assert outcome[0].startswith("not relisted: the commit's code")
    # a list read from the commit of a run that had uncommitted changes proves nothing
    part = record(listed.cells)
    part["provenance"].update(uncommitted_changes=True, dependencies_listed="later")
    (folder / f"{chapter}.json").write_text(
        json.dumps(dict(chapter=chapter, profile="paper", parts=[part]))
    )
    (outcome,) = records.relist(chapter, folder, root, log=lambda line: None)
    assert outcome == ["not relisted: its list was read from a commit its run had changed"]


def test_every_chapter_reads_its_sizes_by_name_only():
    """A record's key counts the settings of a profile table that are read by name
    (``P.max_steps``). So toycore hands a table out only through ``select(profile, **TABLE)``
    (settings as attributes), and a chapter reads what ``sizes(...)`` returns by name only,
    never passing it on whole (``vars(P)``, ``f(P)``), which could read others unseen."""
    tables = {
        node.targets[0].id
        for node in ast.parse((PACKAGE / "sizes.py").read_text()).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    for path in PACKAGE.rglob("*.py"):
        if path.name == "sizes.py":
            continue
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in tables:
                spread = parents.get(node)
                assert isinstance(spread, ast.keyword) and spread.arg is None, path
                call = parents.get(spread)
                assert isinstance(call, ast.Call) and ast.unparse(call.func) == "select", path
    for chapter in CHAPTERS:
        cells = json.loads((REPO_ROOT / "chapters" / f"{chapter}.ipynb").read_text())["cells"]
        source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        tree = ast.parse(source)
        sizes = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).split(".")[-1] == "sizes"
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        assert "P" in sizes, chapter
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in sizes:
                parent = parents.get(node)
                by_name = isinstance(parent, ast.Attribute) and parent.value is node
                assigned = isinstance(parent, ast.Assign) and node in parent.targets
                assert by_name or assigned, f"{chapter}: {ast.unparse(parent)}"


def _two_section_chapter():
    """A chapter whose section 1 reads the training's batch and section 2 its evaluation
    samples, with ids both literal and built by an f-string."""
    return [
        _cell("code", "profile = None"),
        _cell(
            "code",
            "from toycore.claims import Ledger\n"
            "from toycore.experiments import rug_training as rt\n"
            "ledger = Ledger('99_probe', profile)",
        ),
        _cell("markdown", "## 1. The batch"),
        _cell("code", "ledger.at_most('one.batch', 'c', 's', measured=rt.BATCH, bound=4096)"),
        _cell("markdown", "## 2. The samples"),
        _cell(
            "code",
            "for k in (1, 2):\n"
            "    ledger.at_least(f'two.n{k}', 'c', 's', measured=rt.EVAL_SAMPLES, bound=k)",
        ),
        _cell("markdown", "## Claims ledger"),
        _cell("code", "ledger.save()"),
    ]


def test_a_claim_is_found_in_the_section_whose_cells_make_it():
    made = claim_sections(_two_section_chapter())
    assert made == [("one.batch", "1"), ("two.n*", "2")]
    assert [section_of_claim(c, made) for c in ("one.batch", "two.n2", "two.x", "three")] == [
        "1",
        "2",
        None,
        None,
    ]
    # the longest literal start wins; two sections that could make a claim name neither
    made = [("two.*", "1"), ("two.n*", "2"), ("dup", "1"), ("dup", "3")]
    assert section_of_claim("two.n1", made) == "2" and section_of_claim("two.x", made) == "1"
    assert section_of_claim("dup", made) is None


def test_a_run_of_several_sections_is_split_into_parts_that_stale_alone(tmp_path):
    """A whole-chapter part becomes one part per section, each listing what its own section
    depends on at the commit: an edit that only section 2 reads then stales section 2 alone."""
    root, chapter = tmp_path / "repo", "99_probe"
    notebook = {"cells": _two_section_chapter(), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    commit = _committed_repository(root, chapter, notebook)
    code = Code.from_folder(root / "toycore")
    whole = records.chapter_dependencies(chapter, None, code, root=root)
    rows = [
        dict(id=claim, profile="paper", chapter=chapter, passed=True)
        for claim in ("one.batch", "two.n1", "two.n2")
    ]
    given = dict(commit=commit, uncommitted_changes=False, code=whole.key, recorded="then")
    part = dict(sections=None, provenance=given, dependencies=whole.to_json(), rows=rows)
    folder = root / "results" / "paper"
    folder.mkdir(parents=True)
    path = folder / f"{chapter}.json"
    path.write_text(json.dumps(dict(chapter=chapter, profile="paper", parts=[part])))
    with pytest.raises(ValueError, match="not a record"):  # the rows lack a record's keys
        records.split(chapter, folder, root, log=lambda line: None)
    full = [{**row, **{key: 0 for key in records.ROW_KEYS if key not in row}} for row in rows]
    for row in full:
        row["passed"] = True
    given.update({key: "x" for key in records.PROVENANCE if key not in given})
    given.update(device_type="cpu", wall_time_s=5.0)
    path.write_text(
        json.dumps(dict(chapter=chapter, profile="paper", parts=[{**part, "rows": full}]))
    )
    assert records.split(chapter, folder, root, log=lambda line: None) == [[], []]
    one, two = json.loads(path.read_text())["parts"]
    assert [one["sections"], two["sections"]] == [[1], [2]]
    assert [r["id"] for r in one["rows"]] == ["one.batch"]
    assert [r["id"] for r in two["rows"]] == ["two.n1", "two.n2"]
    assert one["provenance"]["recorded"] == two["provenance"]["recorded"] == "then"
    assert "split" in one["provenance"] and one["provenance"]["code"] != two["provenance"]["code"]
    training = root / "toycore" / "experiments" / "rug_training.py"
    text = training.read_text()
    assert "EVAL_SAMPLES = 16_384\n" in text
    training.write_text(text.replace("EVAL_SAMPLES = 16_384\n", "EVAL_SAMPLES = 32_768\n", 1))
    now = Code.from_folder(root / "toycore")
    stale = [
        records.staleness(
            chapter, p, records.chapter_dependencies(chapter, p["sections"], now, root)
        )
        for p in (one, two)
    ]
    # the cells name a literal constant, which counts by its value, in section 2's code
    assert stale == [
        [],
        ["experiments.rug_training.EVAL_SAMPLES (16384 → 32768)", "the code of §2 cell 1"],
    ]
    # a row that no numbered section makes cannot be recorded by section
    with pytest.raises(ValueError, match="'zero' is not made by one numbered section"):
        records.by_section(chapter, [{"id": "zero"}], root=root)


def test_importing_one_more_name_stales_nothing_and_older_lists_are_relisted(tmp_path):
    """An import counts only the names that statements feeding rows use: importing a name for
    a figure or a glued sentence changes no key. A list made when an import counted whole is
    listed again from its commit, and is then current."""
    cells = _two_section_chapter()
    code = Code.from_folder(PACKAGE)
    listed = notebook_dependencies(code, cells, "paper")
    cells[1] = _cell("code", cells[1]["source"].replace("import Ledger", "import Ledger, row_of"))
    assert notebook_dependencies(code, cells, "paper").key == listed.key
    assert notebook_dependencies(code, cells, "paper", rule="whole imports").key != listed.key
    # a part listed under the earlier rule, relisted from its commit
    stale = _relisted_from_an_earlier_rule(tmp_path, cells, 1, "whole imports", code)
    # and section 1's rt.BATCH, a literal constant, now counts by its value in its cell
    assert stale == [
        "experiments.rug_training.BATCH (no longer used)",
        "the code of the setup cell 2",
        "the code of §1 cell 1",
    ]


def test_a_progress_bar_stales_nothing_and_what_feeds_numbers_still_counts(copy, original):
    """Taking the progress bars out of the training loops and the critical-point search
    (``bar = progress_bar(...)``, ``bar.update(1)``, ``bar.close()``) and wrapping a step in
    ``with elapsed(...)`` change no record's key and no cached result's key, where the rule
    before staled every chapter. A bar fed by a call that is not neutral, a bar that kept code
    reads, and a neutral call whose result feeds numbers all still count."""
    folder, edit = copy
    for relative in ("train.py", "experiments/linear.py"):
        path = folder / relative
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(line for line in lines if not line.strip().startswith("bar")))
    edit(
        "train.py",
        "        optim.step()\n",
        "        with elapsed(desc):\n            optim.step()\n",
    )
    edit("train.py", "import progress_bar", "import elapsed, progress_bar")
    bare = Code.from_folder(folder)
    assert _keys(bare) == _keys(original)
    assert _result_keys(bare) == _result_keys(original)
    name, before = "toycore.train.train", RULES[RULES.index("neutral calls dropped") - 1]
    assert bare.function_key(name, before) != original.function_key(name, before)
    for chapter in CHAPTERS:  # each trains through a loop with a bar
        assert _chapter_key(bare, chapter, before) != _chapter_key(original, chapter, before)

    def train_key(old, new):
        edit("train.py", old, new)
        key = Code.from_folder(folder).function_key(name)
        edit("train.py", new, old)
        return key

    plain, step = bare.function_key(name), "        optim.zero_grad("
    fed = "        bar = progress_bar(steps, desc)\n        bar.update(model.step())\n"
    assert train_key(step, fed + step) != plain  # the model's step may change numbers
    read = "        bar = progress_bar(steps, desc)\n        lr = lr * bar.n\n"
    assert train_key(step, read + step) != plain
    assert train_key("with elapsed(desc):", "with elapsed(desc) as lr:") != plain
    runs = "runs = iter(shards.run(train_group, calls, desc))"
    edit("experiments/rug_training.py", runs, runs.replace("calls,", "calls[:1],"))
    chapter = "05_persian_rug"
    assert _chapter_key(Code.from_folder(folder), chapter) != _chapter_key(original, chapter)


def _relisted_from_an_earlier_rule(tmp_path, cells, section, rule, code):
    """Commit a chapter of ``cells``, record ``section`` as listed under the earlier ``rule``,
    relist it: it must come out current, listed as the present rule lists it. Returns what
    made it stale before."""
    root, chapter = tmp_path / "repo", "99_probe"
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    commit = _committed_repository(root, chapter, notebook)
    earlier = records.chapter_dependencies(chapter, [section], code, root, rule=rule)
    part = dict(sections=[section], provenance=dict(commit=commit, code=earlier.key), rows=[])
    part["dependencies"] = earlier.to_json()
    folder = root / "results" / "paper"
    folder.mkdir(parents=True)
    (folder / f"{chapter}.json").write_text(
        json.dumps(dict(chapter=chapter, profile="paper", parts=[part]))
    )
    now = records.chapter_dependencies(chapter, [section], code, root)
    stale = records.staleness(chapter, part, now)
    assert records.relist(chapter, folder, root, log=lambda line: None) == [[]]
    (relisted,) = json.loads((folder / f"{chapter}.json").read_text())["parts"]
    assert relisted["dependencies"]["key"] == now.key == relisted["provenance"]["code"]
    return stale


def test_a_statement_s_own_names_are_its_own_and_an_append_in_a_loop_feeds_rows(tmp_path):
    """A display whose comprehension's variable shares its name with a row loop's feeds no
    row: what only it reads (the batch) is not in the key. A loop that appends to the list the
    rows read feeds them: what it reads (the evaluation samples) is. The rule before had both
    the wrong way round; a part listed under it is relisted from its commit, and is current."""
    cells = _two_section_chapter()
    cells[5] = _cell(
        "code",
        "shown = {k: rt.BATCH for k in (1, 2)}\n"
        "print(shown)\n"
        "samples = []\n"
        "for j in (1, 2):\n"
        "    samples.append(rt.EVAL_SAMPLES * j)\n"
        "for k, s in zip((1, 2), samples):\n"
        "    ledger.at_least(f'two.n{k}', 'c', 's', measured=s, bound=k)",
    )
    code = Code.from_folder(PACKAGE)
    earlier = RULES[RULES.index("own names scoped") - 1]

    def reads(rule):
        listed = notebook_dependencies(code, cells_for(cells, [2], rule), "paper", rule)
        return {name.rsplit(".", 1)[-1] for name in listed.toycore} & {"BATCH", "EVAL_SAMPLES"}

    # read as units: under the last rule these literal constants count by their values
    assert reads("own names scoped") == {"EVAL_SAMPLES"}
    assert reads(earlier) == {"BATCH"}
    assert _relisted_from_an_earlier_rule(tmp_path, cells, 2, earlier, code)


@pytest.mark.parametrize(
    "section, reads",
    [
        # a comprehension's first iterable is read outside it, where n is the batch
        (
            "n = rt.BATCH\n"
            "ledger.at_least('two.n', 'c', 's', measured=sum(1 for n in range(n)), bound=1)",
            {"BATCH"},
        ),
        # a lambda's argument is its own; the m beside it is the outer one
        (
            "m = rt.BATCH\nledger.at_least('two.n', 'c', 's', measured=(lambda m: m)(m), bound=1)",
            {"BATCH"},
        ),
        # a with block's loop binds k after the block has read the outer k
        (
            "import contextlib\n"
            "k = rt.BATCH\n"
            "with contextlib.nullcontext():\n"
            "    total = k\n"
            "    for k in (1, 2):\n"
            "        total += k\n"
            "ledger.at_least('two.n', 'c', 's', measured=total, bound=1)",
            {"BATCH"},
        ),
        # an annotation without a value binds nothing
        (
            "x = rt.BATCH\nx: int\nledger.at_least('two.n', 'c', 's', measured=x, bound=1)",
            {"BATCH"},
        ),
        # corrections in a loop change the ledger, not what its rows read
        (
            "fixes = [rt.BATCH]\n"
            "for fix in fixes:\n"
            "    ledger.correction('two.fix', 's', 'w', fix=str(fix))\n"
            "ledger.at_least('two.n', 'c', 's', measured=rt.EVAL_SAMPLES, bound=1)",
            {"EVAL_SAMPLES"},
        ),
    ],
)
def test_a_name_is_read_from_the_scope_python_reads_it_from(section, reads):
    cells = _two_section_chapter()
    cells[5] = _cell("code", section)
    # the names read as units (under the last rule, literal constants count by their values)
    rule = "own names scoped"
    listed = notebook_dependencies(
        Code.from_folder(PACKAGE), cells_for(cells, [2], rule), "paper", rule
    )
    named = {name.rsplit(".", 1)[-1] for name in listed.toycore}
    assert named & {"BATCH", "EVAL_SAMPLES"} == reads


def test_a_literal_constant_counts_by_its_value_where_a_row_names_it(copy, original, tmp_path):
    """Naming a number a chapter wrote out (a literal toycore constant instead of 0.05) stales
    nothing; changing the constant's value stales what reads it, as editing the number would;
    a constant that is not a literal stays a unit of the closure. A part listed under the rule
    before is relisted from its commit, and is current."""
    folder, edit = copy
    edit(
        "experiments/rug_training.py",
        "BATCH = 1024\n",
        "BATCH = 1024\nPROBE_TOLERANCE = 0.05\nPROBE_SCALED = 2 * BATCH\n",
    )
    code = Code.from_folder(folder)

    def key(tolerance, code=code, rule=RULES[-1]):
        return notebook_dependencies(code, probe_cells(tolerance=tolerance), "paper", rule).key

    assert key("rt.PROBE_TOLERANCE") == key("0.05") != key("0.1")
    assert key("rt.PROBE_TOLERANCE", rule="own names scoped") != key(
        "0.05", rule="own names scoped"
    )
    before = notebook_dependencies(code, probe_cells(tolerance="rt.PROBE_TOLERANCE"), "paper")
    edit("experiments/rug_training.py", "PROBE_TOLERANCE = 0.05", "PROBE_TOLERANCE = 0.1")
    assert key("rt.PROBE_TOLERANCE", Code.from_folder(folder)) == key("0.1")
    after = notebook_dependencies(
        Code.from_folder(folder), probe_cells(tolerance="rt.PROBE_TOLERANCE"), "paper"
    )
    # what changed says which constant, and its values
    assert changes(before, after) == [
        "experiments.rug_training.PROBE_TOLERANCE (0.05 → 0.1)",
        "the code of §1 cell 3",
    ]
    assert before.constants == {"toycore.experiments.rug_training.PROBE_TOLERANCE": "0.05"}
    named = notebook_dependencies(code, probe_cells(tolerance="rt.PROBE_SCALED"), "paper")
    assert "toycore.experiments.rug_training.PROBE_SCALED" in named.toycore
    # a part listed when rt.BATCH counted as a unit, relisted from its commit
    cells = probe_cells(measured="sweep.loss.mean() * rt.BATCH")
    stale = _relisted_from_an_earlier_rule(tmp_path, cells, 1, "own names scoped", original)
    # (and the cached training, whose decorator counted then, and its loop's progress bar)
    assert stale == [
        "experiments.rug_training.train_group",
        "train.train_until_converged",
        "the code of §1 cell 3",
    ]


def test_caching_a_function_stales_nothing_and_older_lists_are_relisted(copy, original, tmp_path):
    """``@cached`` (a decorator that names a function of a neutral module) changes no number:
    adding it to a function chapter 5's rows read stales no record and no other function's
    results, where the rule before staled chapter 5. A stamp, ``@cached(version=...)``, and
    any other decorator still count. A part listed under the rule before is relisted from its
    commit, and is current."""
    folder, edit = copy
    uncached = "@torch.no_grad()\ndef rug_model_losses("
    edit("experiments/persian_rug.py", uncached, "@cached\n" + uncached)
    cached = Code.from_folder(folder)
    assert _keys(cached) == _keys(original)
    results = _result_keys(cached)
    assert "toycore.experiments.persian_rug.rug_model_losses" in results
    assert {name: results[name] for name in _result_keys(original)} == _result_keys(original)

    def chapter_5(code, rule=RULES[-1]):
        cells = json.loads((REPO_ROOT / "chapters" / "05_persian_rug.ipynb").read_text())["cells"]
        return notebook_dependencies(code, cells, "paper", rule)

    before = RULES[RULES.index("neutral decorators dropped") - 1]
    assert chapter_5(cached, before).key != chapter_5(original, before).key
    stamped = "@cached(version='2')\n@torch.no_grad()\ndef rug_model_losses("
    edit("experiments/persian_rug.py", "@cached\n" + uncached, stamped)
    assert chapter_5(Code.from_folder(folder)).key != chapter_5(original).key
    edit("experiments/persian_rug.py", stamped, "def rug_model_losses(")  # no_grad gone
    assert chapter_5(Code.from_folder(folder)).key != chapter_5(original).key
    # the probe's training is cached: a part listed when @cached counted, relisted
    stale = _relisted_from_an_earlier_rule(tmp_path, probe_cells(), 1, before, original)
    assert stale == ["experiments.rug_training.train_group", "train.train_until_converged"]
