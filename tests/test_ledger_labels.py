"""A ledger row's labels are decided before measuring.

A row's ``known_failure`` and ``outside_regime`` may depend only on sizes and settings: literals,
the profile's sizes ``P``, the notebook's parameters, NumPy and the builtins, the regime
criterion of chapter 5's theory (a function of p and ns) and the cells it counts as too sparse or
too small to represent features (constants), and names the notebook computes from those alone.
Anything a chapter measures comes from ``toycore``'s experiments (``ex``) or another
computation, so a label that reads such a name could be reading its own row's value: this test
reads every chapter's code cells and refuses it."""

import ast
import builtins
import json

import pytest

from toycore.paths import REPO_ROOT

CHAPTERS = sorted((REPO_ROOT / "chapters").glob("*.ipynb"))
LEDGER_FORMS = {"close_to", "at_most", "at_least", "equal"}
LABELS = {"known_failure", "why", "outside_regime"}
# the names a label may start from: the sizes, the parameters, NumPy, the builtins
SETTINGS = {"P", "profile", "device", "np"} | set(dir(builtins))
PARAMETERS = {"P", "profile", "device"}  # settings however the notebook computes them
# functions of sizes and settings alone, which a label may call, and settings that toycore names
SIZE_FUNCTIONS = {
    ("th", "in_regime"),
    ("th", "regime_size"),
    ("ex", "UNREPRESENTED_DENSITY"),  # where chapter 5's features cannot be represented
    ("ex", "UNREPRESENTED_RATIO"),
    ("ex", "TEXT_LARGEST_SIZE"),  # the ns the text's own claims at its largest size name
    ("ex", "HEADLINE_DENSITY"),  # the headline's cell: Figure 3's p, and our nd/ns
    ("ex", "HEADLINE_RATIO"),
    ("ex", "FIGURE3_STEPS"),  # chapter 3: the authors' recipe for Figure 3
    ("ex", "FEWER_COLLISIONS_ABOVE_N"),  # chapter 3: from which n the landings read Figure 3
}


def _loads(node):
    """The names an expression reads, leaving out the modules of SIZE_FUNCTIONS' calls."""
    allowed = {
        id(n.value)
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and (n.value.id, n.attr) in SIZE_FUNCTIONS
    }
    return {
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in allowed
    }


def _targets(node):
    return {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def _loop_bindings(target, iterable):
    """(name, expression it comes from) for a for loop or a comprehension: zip and enumerate
    are followed element by element, so that `for n, x in zip(sizes, measured)` gives n only
    what sizes holds."""
    if isinstance(target, ast.Tuple) and isinstance(iterable, ast.Call):
        function = getattr(iterable.func, "id", None)
        args = iterable.args
        if function == "zip" and len(args) == len(target.elts):
            return [b for t, a in zip(target.elts, args) for b in _loop_bindings(t, a)]
        if function == "enumerate" and len(target.elts) == 2 and len(args) == 1:
            return [(name, ast.Constant(0)) for name in _targets(target.elts[0])] + list(
                _loop_bindings(target.elts[1], args[0])
            )
    return [(name, iterable) for name in _targets(target)]


def bindings(tree):
    """Every name the code binds, with the expressions it is bound to (None: a binding that is
    never clean, such as an import of anything but NumPy or a function definition)."""
    bound = {}

    def bind(name, value):
        bound.setdefault(name, []).append(value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts):
                        for name in _targets(t):
                            bind(name, v)
                else:
                    for name in _targets(target):
                        bind(name, node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            for name in _targets(node.target):
                bind(name, node.value)
        elif isinstance(node, (ast.For, ast.comprehension)):
            for name, value in _loop_bindings(node.target, node.iter):
                bind(name, value)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bind(name, None if name != "np" else ast.Constant(0))
        elif isinstance(node, (ast.FunctionDef, ast.Lambda, ast.ClassDef)):
            if not isinstance(node, ast.Lambda):
                bind(node.name, None)
            for arg in ast.walk(node.args) if not isinstance(node, ast.ClassDef) else []:
                if isinstance(arg, ast.arg):
                    bind(arg.arg, None)
        elif isinstance(node, (ast.With, ast.NamedExpr, ast.ExceptHandler)):
            names = (
                {node.name} if isinstance(node, ast.ExceptHandler) and node.name else _targets(node)
            )
            for name in names:
                bind(name, None)
    return bound


def clean_names(tree):
    """The names computed from settings alone (the greatest set closed under the bindings)."""
    bound = bindings(tree)
    clean = SETTINGS | set(bound)
    changed = True
    while changed:
        changed = False
        for name, values in bound.items():
            if name in clean and name not in PARAMETERS:
                if any(v is None or not _loads(v) <= clean for v in values):
                    clean.discard(name)
                    changed = True
    return clean


def label_problems(source):
    """Each label in ``source`` that reads something other than sizes and settings, as
    'line N: known_failure reads x, y'."""
    tree = ast.parse(source)
    clean = clean_names(tree)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in LEDGER_FORMS:
            for keyword in node.keywords:
                if keyword.arg in LABELS:
                    read = sorted(_loads(keyword.value) - clean)
                    if read:
                        problems.append(
                            f"line {keyword.lineno}: {keyword.arg} reads {', '.join(read)}"
                        )
    return problems


def notebook_source(path):
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_label_is_decided_from_sizes_and_settings(chapter):
    assert label_problems(notebook_source(chapter)) == []


def _named_explanations(value):
    """The row ids a known_failure expression can name: string constants, through conditional
    expressions; None for anything else (a literal True, a computed name)."""
    if isinstance(value, ast.IfExp):
        body, orelse = _named_explanations(value.body), _named_explanations(value.orelse)
        return None if body is None or orelse is None else body | orelse
    if isinstance(value, ast.Constant) and (value.value is None or isinstance(value.value, str)):
        return {value.value} - {None, ""}
    if isinstance(value, ast.JoinedStr):  # a row made per case, named per case
        return {ast.unparse(value)}
    return None


def explanation_problems(source, makes):
    """Each known failure that does not name, as a string, a row the chapter makes (``makes``:
    claim id -> whether the chapter's code can make it), as 'line N: ...'."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in LEDGER_FORMS:
            for keyword in node.keywords:
                if keyword.arg != "known_failure":
                    continue
                named = _named_explanations(keyword.value)
                if named is None:
                    problems.append(
                        f"line {keyword.lineno}: known_failure is not the id of its "
                        f"explanation row: {ast.unparse(keyword.value)}"
                    )
                    continue
                for name in named:
                    pattern = name[2:-1] if name.startswith(("f'", 'f"')) else name
                    if not makes(pattern.split("{")[0]) and not makes(name):
                        problems.append(f"line {keyword.lineno}: no row {name} in the chapter")
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_known_failure_names_a_row_of_its_chapter_that_tests_its_explanation(chapter):
    from test_scale import claim_ids_in

    source = notebook_source(chapter)
    assert explanation_problems(source, claim_ids_in(chapter)) == []


def test_the_rule_refuses_a_literal_true_and_a_row_the_chapter_does_not_make():
    source = """
ledger.close_to("a", "c", "s", expected=1, measured=2, tolerance=0, known_failure=True, why="w")
ledger.close_to("b", "c", "s", expected=1, measured=2, tolerance=0, known_failure="a.why", why="w")
ledger.close_to("c", "c", "s", expected=1, measured=2, tolerance=0,
                known_failure="b" if P.small else None, why="w")
ledger.at_most("d", "c", "s", measured=1, bound=2, known_failure=flag, why="w")
"""
    makes = {"a", "b", "c", "d"}.__contains__
    assert explanation_problems(source, makes) == [
        "line 2: known_failure is not the id of its explanation row: True",
        "line 3: no row a.why in the chapter",
        "line 6: known_failure is not the id of its explanation row: flag",
    ]


def test_the_rule_refuses_a_label_that_reads_a_measurement_and_accepts_sizes():
    reads_its_value = """
ratio = ex.size_sweep(P.sizes).loss / 2
for n, r in zip(P.sizes, ratio):
    ledger.close_to("a", "c", "s", expected=1, measured=r, tolerance=0.1,
                    known_failure=abs(r - 1) > 0.1)
"""
    assert label_problems(reads_its_value) == ["line 5: known_failure reads r"]
    through_a_name = """
ratios = ex.run(P.sizes)
bad = ratios.mean() > 1
ledger.at_most("b", "c", "s", measured=ratios.mean(), bound=1, outside_regime=bad and "why")
"""
    assert label_problems(through_a_name) == ["line 4: outside_regime reads bad"]
    sizes_only = """
sizes = np.array(P.sweep_sizes)
active = 0.045 * sizes
measured = ex.run(sizes)
for n, m, k in zip(sizes, measured, active):
    small = n < 512
    ledger.close_to("c", "c", "s", expected=1, measured=m, tolerance=0.1,
                    known_failure=small, outside_regime="" if k >= 40 else "few features")
    ledger.equal("d", "c", "s", expected=1, measured=m,
                 outside_regime="" if th.in_regime(0.045, n) else "few features")
"""
    assert label_problems(sizes_only) == []
    assert label_problems(sizes_only.replace("th.in_regime", "th.rug_loss")) == [
        "line 10: outside_regime reads th"
    ]
