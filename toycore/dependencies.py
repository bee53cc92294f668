"""What a number depends on: the code it can depend on, found by reading that code.

A cached result's key and a paper record's key cover exactly the code their numbers can
depend on, so that an edit which changes no number (a comment, a docstring, a figure, the
build) keeps every result and record current, and an edit which can change one stales exactly
the results and records that run it.

**Units.** toycore's source is read as a set of units: each module-level function, constant
(``X = ...``), class header (its bases, decorators and class-level statements), method, and a
module's other top-level statements (its *preamble*). A unit's digest is the sha256 of its
syntax tree, normalised: docstrings, comments and formatting are gone, and so are the things
that cannot change a number: annotations of arguments and returns, the messages of ``raise``
and ``assert``, ``print`` calls, decorators that name a function of a module that cannot
change a number (``NEUTRAL``, below: ``@cached``), and the statements that only drive such a
module's objects (a progress bar: ``bar = progress_bar(n, desc)``, ``bar.update(1)``; ``with
elapsed(desc):`` around a body, which stays).

**Closure.** A unit depends on the units its names resolve to in its module (through
``import`` and ``from ... import``, relative or not, and attribute chains such as
``th.rug_loss``), followed transitively. A method called on an object whose class no name
reveals (``model.step()``) is covered by every method of that name in the classes already in
the closure; an included class brings its dunder methods and ``forward`` (called implicitly).
A local name that shadows a module's global is read as the global: where it cannot be sure,
the closure covers more. Modules that cannot change a number are left out (``NEUTRAL``: the
cache, shards, progress bars, plots, widgets, records, the build); so are libraries outside
toycore, whose versions are part of each key instead.

**Why static.** Tracing what runs (``sys.settrace``, coverage) would see only the branches that
one run took, so a paper-size branch that a small run skips would be missing from the key: too
narrow. Reading the code covers every branch, runs nothing, is cheap, and can be done on any
commit's source (``Code.from_folder``), which is how a record made before this key existed is
checked. joblib.Memory compares a function's raw text alone (a comment re-runs it, a changed
helper does not); redun hashes a task's raw source and leaves plain helpers and constants out;
Hamilton normalises a node's source but does not follow the functions it calls.

**A chapter's record** (``notebook_dependencies``) depends on the code cells of the chapter
that feed its ledger rows, sliced backwards from the rows statement by statement (with the
rows' texts, claim, source, note and why, left out: they change no verdict), on the toycore
closure of the names those statements use, the verdict logic of ``toycore.claims`` included,
and on the sizes of its own profile: a table keyed by every profile counts only its entry for
that profile, and of that entry only the settings some statement or unit of the closure reads
by name (``P.beyond_sizes``; ``select`` hands them out as attributes), so that a size only
section 11 reads stales section 11 alone. Display statements (``show``, ``glue``, ``print``,
``ledger.table()``) feed no row; any other statement that is a bare call is kept, since it may
change state. An import counts only the names that kept statements use: importing one more
name for a figure changes no key. A toycore constant assigned a literal (a number, a string, a
tuple of them) counts by its value where a kept statement names it, as if the number were
written out: naming a number the chapter repeats changes no key, and changing the constant's
value stales exactly what reads it. Names are scoped as Python scopes them: a statement is needed
for the names a kept statement reads before binding them itself, and a comprehension's variable
defines nothing outside it, so a display ``{n: f(n) for n in sizes}`` feeds no row that a later
``for n in ...`` makes; ``x.append(v)`` inside a loop changes x as it does at top level.
What it cannot see, and the chapters therefore do not write: a call that changes an argument
(``train(model)`` to change ``model``), a change through a subscript or a call
(``rows[k].append(v)``), a function defined in a cell that reads a global assigned after it.
"""

import ast
import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_NAME = "toycore"
# Modules whose code cannot change a number (prefixes of dotted names).
NEUTRAL = (
    "toycore.allocator",
    "toycore.cache",
    "toycore.dependencies",
    "toycore.shards",
    "toycore.progress",
    "toycore.plots",
    "toycore.widgets",
    "toycore.records",
    "toycore.paths",
    "toycore.offline",
    "toycore.book",
)
# The ledger's forms that add a row (toycore.claims.Ledger); its other methods add none.
ROW_FORMS = ("close_to", "at_most", "at_least", "equal")
# A row's words, which change no verdict: positional claim and source, keywords note and why.
ROW_TEXT_POSITIONS = (1, 2)
ROW_TEXT_KEYWORDS = ("note", "why")
DISPLAY_CALLS = ("print", "display")
IMPLICIT_METHODS = ("forward",)  # torch's Module.__call__ calls it
PROFILES = ("ci", "cpu", "paper")  # as toycore.profiles.PROFILES, without importing it
# The rules a chapter's list has been made under, oldest first (``records.relist`` reads a part
# listed under an earlier one): an import statement counted whole; then only the names used
# from it; then a statement's own names (a comprehension's variables, a loop's target) no longer
# make it a definition of a later statement's same-named variable, and ``x.append(v)`` inside
# a block changes x as it does at top level.
# Then a toycore constant that is a literal counts by its value where a row's code names it,
# so that naming a number the chapter wrote out (``ex.HEADLINE_DENSITY`` for 0.045) stales
# nothing, and changing the constant's value stales what reads it.
# Then a decorator that names a neutral module's function (``@cached``) is no part of the
# unit it decorates: caching a function changes none of its numbers. Last, nor are the
# statements that only drive a neutral module's objects (a progress bar and its updates).
RULES = (
    "whole imports",
    "imported names used",
    "own names scoped",
    "constants by value",
    "neutral decorators dropped",
    "neutral calls dropped",
)
RULE = RULES[-1]


def _is_neutral(name):
    return any(name == module or name.startswith(module + ".") for module in NEUTRAL)


def _digest(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Normalise(ast.NodeTransformer):
    """What can change no number, taken out of a tree (comments and formatting never get in)."""

    def _body(self, body):
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                body = body[1:]  # a docstring
        return [node for node in body if not _is_print(node)] or [ast.Pass()]

    def generic_visit(self, node):
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, self._body(value))
        return node

    def visit_arg(self, node):
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Raise(self, node):
        if isinstance(node.exc, ast.Call):  # raise ValueError(message): the type alone
            node.exc = node.exc.func
        return node

    def visit_Assert(self, node):
        node.msg = None
        return self.generic_visit(node)


def _is_print(node):
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "print"
    )


def _dump(node):
    return serialise(_Normalise().visit(_copy(node)))


def serialise(node):
    """A syntax tree as text, the same on every Python version the package supports: like
    ``ast.dump``, but leaving out empty fields, which newer Pythons add (``type_params=[]``)."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is not None and value != []:
                fields.append(f"{name}={serialise(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(serialise(item) for item in node)}]"
    return repr(node)


def _copy(node):
    return copy.deepcopy(node)


@dataclass
class Unit:
    """A piece of a module that a name can reach: see the module's docstring."""

    name: str  # dotted: toycore.models.ToyModel.step
    module: str
    node: ast.AST  # a statement, or a ClassDef whose methods are units of their own
    kind: str  # function, class, method, constant, preamble
    methods: dict = field(default_factory=dict)  # a class's: {name: unit name}


class _Module:
    def __init__(self, name, text, is_package):
        self.name, self.is_package = name, is_package
        self.tree = ast.parse(text)
        self.units = {}  # unit name -> Unit
        # a global name -> [("unit", name) | ("module", name) | ("from", module, attribute)]
        self.globals = {}
        preamble = []
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._add(node.name, Unit(f"{name}.{node.name}", name, node, "function"))
            elif isinstance(node, ast.ClassDef):
                self._add_class(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                if not names:
                    preamble.append(node)
                    continue
                unit = Unit(f"{name}.{names[0]}", name, node, "constant")
                if unit.name in self.units:  # defined twice: one unit for both
                    unit.name += f"#{node.lineno}"
                for target in names:
                    self._add(target, unit)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.globals.setdefault(alias.asname, []).append(("module", alias.name))
                    else:  # import a.b binds a
                        top = alias.name.split(".")[0]
                        self.globals.setdefault(top, []).append(("module", top))
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(node)
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    self.globals.setdefault(alias.asname or alias.name, []).append(
                        ("from", source, alias.name)
                    )
            elif _is_docstring(node):
                continue
            else:
                preamble.append(node)
        self.preamble = None
        if preamble:
            self.preamble = Unit(f"{name}.<preamble>", name, ast.Module(preamble, []), "preamble")
            self.units[self.preamble.name] = self.preamble
            for node in preamble:
                for stored in _stored_names(node):
                    self.globals.setdefault(stored, []).append(("unit", self.preamble.name))

    def _add(self, name, unit):
        self.units[unit.name] = unit
        self.globals.setdefault(name, []).append(("unit", unit.name))

    def _add_class(self, node):
        header = ast.ClassDef(
            name=node.name,
            bases=node.bases,
            keywords=node.keywords,
            body=[
                n
                for n in node.body
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not _is_docstring(n)
            ]
            or [ast.Pass()],
            decorator_list=node.decorator_list,
        )
        unit = Unit(f"{self.name}.{node.name}", self.name, header, "class")
        for method in node.body:
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                child = Unit(f"{unit.name}.{method.name}", self.name, method, "method")
                self.units[child.name] = child
                unit.methods.setdefault(method.name, []).append(child.name)
        self._add(node.name, unit)

    def _absolute(self, node):
        if not node.level:
            return node.module
        parts = self.name.split(".")
        package = parts if self.is_package else parts[:-1]
        base = package[: len(package) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))


def _is_docstring(node):
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _stored_names(node):
    return {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def _attribute_chain(node):
    """``a.b.c`` -> ("a", ["b", "c"]); None when the chain does not start at a name."""
    attributes = []
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, attributes[::-1]
    return None


class Code:
    """toycore's source, read into units: ``Code(texts)`` from {module name: source text}."""

    def __init__(self, texts):
        self.texts = dict(texts)
        self.modules = {}
        for name, text in self.texts.items():
            short = name.removesuffix(".__init__")
            self.modules[short] = _Module(short, text, name.endswith(".__init__"))
        self.units = {u: unit for m in self.modules.values() for u, unit in m.units.items()}
        self._digests, self._references = {}, {}

    @classmethod
    def from_folder(cls, folder, package=PACKAGE_NAME):
        """The source of the package in ``folder`` (its .py files, tests and caches left out)."""
        folder = Path(folder)
        texts = {}
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder)
            if "__pycache__" in relative.parts or not all(
                part.isidentifier() for part in relative.with_suffix("").parts
            ):
                continue
            texts[".".join((package, *relative.with_suffix("").parts))] = path.read_text()
        return cls(texts)

    # -- resolving names ----------------------------------------------------------------------

    def _resolve_in_module(self, module, name, seen=None):
        """What ``name`` means at the top level of ``module``: [("unit", u) | ("module", m)]."""
        seen = seen or set()
        if (module, name) in seen:
            return []
        seen.add((module, name))
        info = self.modules.get(module)
        return self._meanings(info.globals.get(name, []) if info else [], seen)

    def _meanings(self, entries, seen=None):
        """A name's entries, each ``("from", module, attribute)`` followed to what it names."""
        found = []
        for entry in entries:
            found += self._member(entry[1], entry[2], seen) if entry[0] == "from" else [entry]
        return found

    def _member(self, module, attribute, seen=None):
        """``module.attribute``: a unit, a submodule, or a name the module imports."""
        if module is None:
            return []
        if module in self.modules:
            found = self._resolve_in_module(module, attribute, seen)
            if found:
                return found
        if f"{module}.{attribute}" in self.modules:
            return [("module", f"{module}.{attribute}")]
        return []

    def _resolve_chain(self, entries, attributes):
        """The units reached by following ``.attr`` through modules and classes."""
        units = set()
        for kind, target in entries:
            rest = list(attributes)
            while rest and kind == "module":
                step = self._member(target, rest[0])
                if not step:
                    break
                rest.pop(0)
                # several meanings of one name: follow the first module, keep every unit
                for other_kind, other in step[1:]:
                    if other_kind == "unit":
                        units.add(other)
                kind, target = step[0]
            if kind == "module":
                if target.startswith(PACKAGE_NAME + ".") or target == PACKAGE_NAME:
                    module = self.modules.get(target)
                    if module and module.preamble:
                        units.add(module.preamble.name)
                continue
            units.add(target)
            unit = self.units.get(target)
            if unit is not None and unit.kind == "class" and rest:
                units.update(unit.methods.get(rest[0], []))
        return units

    def references(self, unit_name):
        """The units a unit names, and the attribute names it reads (on modules, classes or
        objects no name reveals): (set of unit names, set of attribute names)."""
        if unit_name not in self._references:
            unit = self.units[unit_name]
            module = self.modules[unit.module]
            units, loose = self.resolve_names(module.globals, unit.node)
            if unit.kind == "method":  # its class, whose fields and bases it uses
                units.add(unit_name.rsplit(".", 1)[0])
            if module.preamble:
                units.add(module.preamble.name)
            units.discard(unit_name)
            self._references[unit_name] = (units, loose)
        return self._references[unit_name]

    def resolve_names(self, namespace, node):
        """The units that ``node``'s names reach through ``namespace`` ({name: [entries]}, as a
        module's globals), and every attribute name it reads: (units, attribute names). Each
        name and each attribute chain (``a.b.c``, and within it ``a.b``) is resolved."""
        units, loose = set(), set()
        for child in ast.walk(node):
            if isinstance(child, ast.Attribute):
                loose.add(child.attr)
                chain = _attribute_chain(child)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                chain = (child.id, [])
            else:
                continue
            if chain is None or chain[0] not in namespace:
                continue
            units |= self._resolve_chain(self._meanings(namespace[chain[0]]), chain[1])
        return units, loose

    def literal_constant(self, namespace, node):
        """The value of the toycore constant that ``node`` (a name, or an attribute chain such
        as ``ex.HEADLINE_TOLERANCE``) names through ``namespace``, where it is assigned once, to
        one name, a literal number, string or tuple of them: (its unit's name, the value's
        syntax tree); else None."""
        if isinstance(node, ast.Name):
            chain = (node.id, [])
        else:
            chain = _attribute_chain(node)
        if chain is None or chain[0] not in namespace:
            return None
        entries = self._meanings(namespace[chain[0]])
        for attribute in chain[1]:
            if len(entries) != 1 or entries[0][0] != "module":
                return None
            entries = self._member(entries[0][1], attribute)
        if len(entries) != 1 or entries[0][0] != "unit":
            return None
        unit = self.units.get(entries[0][1])
        if unit is None or unit.kind != "constant" or not isinstance(unit.node, ast.Assign):
            return None
        if len(unit.node.targets) != 1 or not isinstance(unit.node.targets[0], ast.Name):
            return None
        try:
            value = ast.literal_eval(unit.node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        items = value if isinstance(value, tuple) else (value,)
        if not all(isinstance(item, (int, float, str)) for item in items):
            return None  # a dict, list or set may be a profile table or changed in place
        return unit.name, unit.node.value

    # -- closure and digests ------------------------------------------------------------------

    def closure(self, roots, attributes=(), profile=None, rule=RULE):
        """Every unit that ``roots`` (unit names) depend on, neutral ones left out, with its
        digest: {unit name: digest}. ``attributes``: names read on objects by code outside
        toycore (a notebook's cells). ``profile``: count only that profile's entry of a
        constant that maps every profile to its settings. ``rule``: one of RULES."""
        included, classes, seen_attributes = set(), set(), set(attributes)
        todo = list(roots)
        while todo:
            name = todo.pop()
            if name in included or _is_neutral(name) or name not in self.units:
                continue
            included.add(name)
            unit = self.units[name]
            found, loose = self.references(name)
            todo += found
            if unit.kind == "class":
                classes.add(name)
                for method, targets in unit.methods.items():
                    implicit = method.startswith("__") or method in IMPLICIT_METHODS
                    if implicit or method in seen_attributes:
                        todo += targets
            new = loose - seen_attributes
            seen_attributes |= new
            for class_name in classes:
                for method in new:
                    todo += self.units[class_name].methods.get(method, [])
        read = frozenset(seen_attributes) if profile is not None else None
        return {name: self.digest(name, profile, read, rule) for name in sorted(included)}

    def digest(self, unit_name, profile=None, read=None, rule=RULE):
        """A unit's digest; with ``profile``, a profile table's counts that profile's entry,
        and with ``read`` (names read as attributes), only the settings among them; under
        ``rule`` (one of RULES), without the decorators that name neutral functions and the
        statements that only drive neutral objects."""
        unit = self.units[unit_name]
        node = self._without_neutral_decorators(unit) if _drops_decorators(rule) else unit.node
        if _drops_neutral_calls(rule):
            node = self._without_neutral_calls(unit, node)
        entry = _profile_entry(node, profile, read) if profile is not None else node
        key = (unit_name, profile, read if entry is not node else None, rule)
        if key not in self._digests:
            self._digests[key] = _digest(_dump(entry))
        return self._digests[key]

    def _without_neutral_decorators(self, unit):
        """``unit``'s node less its decorators that are a name or an attribute chain reaching
        only units of NEUTRAL modules (``@cached``); the node itself where it has none. A call
        (``@cached(version="2")``) stays: its arguments may stamp the results."""
        decorators = getattr(unit.node, "decorator_list", [])
        namespace = self.modules[unit.module].globals
        kept = []
        for decorator in decorators:
            called = isinstance(decorator, ast.Call)
            reached = set() if called else self.resolve_names(namespace, decorator)[0]
            if not (reached and all(_is_neutral(name) for name in reached)):
                kept.append(decorator)
        if len(kept) == len(decorators):
            return unit.node
        node = copy.copy(unit.node)
        node.decorator_list = kept
        return node

    def _without_neutral_calls(self, unit, node):
        """``node`` less the statements that only drive a NEUTRAL module's objects (a progress
        bar: ``bar = progress_bar(n, desc)``, ``bar.update(1)``, ``bar.close()``; ``with
        elapsed(desc):`` around a body, which stays); ``node`` itself where it has none.

        A call is neutral where its function is a name or attribute chain reaching only units
        of NEUTRAL modules (a name the unit binds locally never is), and its arguments call
        nothing but neutral functions (``bar.update(model.step())`` stays: the step changes
        numbers). A variable is neutral where every binding of it is a neutral call and it is
        read only by the statements dropped here: ``runs = shards.run(train_group, ...)``,
        whose results feed numbers, stays."""
        namespace = self.modules[unit.module].globals
        parameters = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        local = _stored_names(node) | parameters

        def calls_only_neutral(nodes):
            return all(
                not isinstance(child, ast.Call) or neutral(child)
                for item in nodes
                for child in ast.walk(item)
            )

        def neutral(call):
            chain = _attribute_chain(call.func)
            if chain is None or chain[0] in local:
                return False
            reached = self.resolve_names(namespace, call.func)[0]
            if not (reached and all(_is_neutral(name) for name in reached)):
                return False
            return calls_only_neutral(call.args + [k.value for k in call.keywords])

        def method_of(call, variables):  # bar.update(1), bar a neutral variable
            chain = _attribute_chain(call.func)
            return (
                chain is not None
                and chain[1] != []
                and chain[0] in variables
                and calls_only_neutral(call.args + [k.value for k in call.keywords])
            )

        bindings = {}  # a name -> how many of its bindings are neutral calls
        for child in ast.walk(node):
            if isinstance(child, ast.Assign) and isinstance(child.value, ast.Call):
                if len(child.targets) == 1 and isinstance(child.targets[0], ast.Name):
                    if neutral(child.value):
                        bindings[child.targets[0].id] = bindings.get(child.targets[0].id, 0) + 1
            elif isinstance(child, ast.withitem) and isinstance(child.optional_vars, ast.Name):
                if isinstance(child.context_expr, ast.Call) and neutral(child.context_expr):
                    name = child.optional_vars.id
                    bindings[name] = bindings.get(name, 0) + 1
        stores = {}
        for child in ast.walk(node):
            if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
                stores[child.id] = stores.get(child.id, 0) + 1
        variables = {n for n, k in bindings.items() if k == stores.get(n) and n not in parameters}

        def dropped(stmt, variables):
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                target = stmt.targets[0] if len(stmt.targets) == 1 else None
                return (
                    isinstance(target, ast.Name) and target.id in variables and neutral(stmt.value)
                )
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                return neutral(stmt.value) or method_of(stmt.value, variables)
            return False

        def unwrapped(stmt, variables):  # with elapsed(desc): its body alone
            return isinstance(stmt, ast.With) and all(
                isinstance(item.context_expr, ast.Call)
                and neutral(item.context_expr)
                and (
                    item.optional_vars is None
                    or getattr(item.optional_vars, "id", None) in variables
                )
                for item in stmt.items
            )

        while True:  # a variable read anywhere but in a dropped statement is not neutral
            ignored = set()
            for child in ast.walk(node):
                if isinstance(child, ast.stmt) and dropped(child, variables):
                    ignored |= {id(n) for n in ast.walk(child)}
                elif unwrapped(child, variables):
                    ignored |= {id(n) for item in child.items for n in ast.walk(item)}
            reads = {
                n.id
                for n in ast.walk(node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in ignored
            }
            if not variables & reads:
                break
            variables -= reads

        class Drop(ast.NodeTransformer):
            def generic_visit(self, child):
                super().generic_visit(child)
                for name in ("body", "orelse", "finalbody"):
                    value = getattr(child, name, None)
                    if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                        kept = []
                        for stmt in value:
                            if unwrapped(stmt, variables):
                                kept += stmt.body
                            elif not dropped(stmt, variables):
                                kept.append(stmt)
                        setattr(child, name, kept or ([ast.Pass()] if name != "orelse" else []))
                return child

        reduced = Drop().visit(_copy(node))
        return node if _dump(reduced) == _dump(node) else reduced

    def function_key(self, qualified_name, rule=RULE):
        """The key of a function's results: a hash of its closure's digests (under ``rule``,
        one of RULES)."""
        if qualified_name not in self.units:
            raise KeyError(f"{qualified_name} is not a function of {PACKAGE_NAME}'s source")
        return _digest(json.dumps(self.closure([qualified_name], rule=rule)))


def _dict_entries(value):
    """The entries of ``dict(a=..., b=...)`` or ``{"a": ..., "b": ...}`` as {name: node}, or None
    for anything else (positional arguments, ``**`` spreads, keys that are not strings)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        if value.args or any(k.arg is None for k in value.keywords):
            return None
        return {k.arg: k.value for k in value.keywords}
    if isinstance(value, ast.Dict) and all(
        isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys
    ):
        return {k.value: v for k, v in zip(value.keys, value.values)}
    return None


def _profile_entry(node, profile, read=None):
    """A constant ``X = dict(ci=..., cpu=..., paper=...)`` read as its ``profile`` entry; with
    ``read``, a set of names, only that entry's settings named in it (where the entry is a
    ``dict`` of names: ``select`` hands those out as attributes). Anything else: ``node``."""
    entries = _dict_entries(getattr(node, "value", None))
    if entries is None or set(entries) != set(PROFILES):
        return node
    entry = entries[profile]
    settings = _dict_entries(entry) if read is not None else None
    if settings is not None:
        kept = sorted(name for name in settings if name in read)
        entry = ast.Dict([ast.Constant(name) for name in kept], [settings[n] for n in kept])
    return ast.Expr(entry)


# -- a chapter's cells ----------------------------------------------------------------------


def section_of(markdown):
    """The section a chapter's Markdown cell opens: "3" for "## 3. ...", "ledger" for the
    claims ledger, None for a cell that opens none."""
    first = markdown.lstrip().splitlines()[0] if markdown.strip() else ""
    if not first.startswith("## "):
        return None
    title = first[3:].strip()
    number = title.split(".")[0]
    return number if number.isdigit() else title.lower()


def parse_sections(text):
    """Sections as a make command names them: "1-3,5" -> [1, 2, 3, 5]; a clear error for
    anything else."""
    chosen = set()
    for piece in str(text).replace(" ", "").split(","):
        first, _, last = piece.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(first) < 1:
            raise ValueError(f"sections are numbers and ranges such as 1-3,5; got {text!r}")
        chosen.update(range(int(first), int(last or first) + 1))
    return sorted(chosen)


def describe_sections(sections):
    """ "the whole chapter", "sections 1 to 3", "sections 1 to 3 and 5", "section 4"."""
    if sections is None:
        return "the whole chapter"
    runs, start = [], None
    for k, section in enumerate(sections):
        if start is None:
            start = section
        if k + 1 == len(sections) or sections[k + 1] != section + 1:
            if section - start == 1:  # two in a row: "6 and 7", not "6 to 7"
                runs += [f"{start}", f"{section}"]
            else:
                runs.append(f"{start}" if start == section else f"{start} to {section}")
            start = None
    words = runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]
    return ("section " if len(sections) == 1 else "sections ") + words


def cells_for(cells, sections, rule=RULE):
    """What runs to record a chapter's ``sections`` (a list of numbers; None: all of it): the
    cells before section 1, the chosen sections' cells and the claims ledger's (its last
    cell saves the ledger), and, from the other sections, only the statements the chosen
    cells need (sliced back from them: a later section that uses an earlier one's models
    recomputes, or reads from the cache, just those, and adds none of that section's rows).
    Markdown cells stay, to name the sections. A clear error for a section the chapter lacks
    or a chapter that does not end by saving its ledger. ``rule``: one of RULES."""
    if "ledger.save()" not in _text(cells[-1]):
        raise ValueError("the chapter does not end with ledger.save()")
    if sections is None:
        return list(cells)
    wanted, section, places = {str(s) for s in sections}, "setup", []
    for cell in cells:
        if cell["cell_type"] == "markdown":
            section = section_of(_text(cell)) or section
        places.append(section)
    missing = sorted(int(s) for s in wanted - set(places))
    if missing:
        raise ValueError(f"the chapter has no section {', '.join(map(str, missing))}")
    chosen = [p in wanted or p in ("setup", "claims ledger") for p in places]
    code = [ast.parse(_text(cell)).body if cell["cell_type"] == "code" else [] for cell in cells]
    # the ledger is what a run makes, never what it needs: its rows elsewhere are not pulled in
    ledgers = _ledger_names(code)
    imported = {
        name
        for body in code
        for stmt in body
        if isinstance(stmt, (ast.Import, ast.ImportFrom))
        for name in _bound([stmt])
    }
    out, needed, scoped = [None] * len(cells), set(), _scopes_own_names(rule)
    for k in range(len(cells) - 1, -1, -1):
        cell = cells[k]
        if cell["cell_type"] != "code" or chosen[k]:
            out[k] = cell
            needed = (needed - _bound(code[k])) | _free(code[k], scoped)
            needed -= ledgers
            continue
        kept = []
        for stmt in reversed(code[k]):
            if _defines(stmt, imported, scoped) & needed:
                kept.insert(0, stmt)
                needed = (needed - _bound([stmt])) | _free([stmt], scoped)
                needed -= ledgers
        if kept:
            out[k] = {**cell, "source": "\n".join(ast.unparse(stmt) for stmt in kept)}
    return [cell for cell in out if cell is not None]


def claim_sections(cells):
    """Where a chapter's cells (nbformat dicts, Markdown included) make their ledger rows:
    [(claim, section)] in the cells' order, a claim being an id (``ledger.close_to("law.slope",
    ...)``) or, for an id built by an f-string, its literal start followed by "*"
    (``f"thomson.n{n}m{m}"`` -> "thomson.n*"); the section as ``section_of`` names it
    ("setup" before the first)."""
    code, section, made = [], "setup", []
    for cell in cells:
        if cell["cell_type"] == "markdown":
            section = section_of(_text(cell)) or section
        elif cell["cell_type"] == "code":
            code.append((section, ast.parse(_text(cell))))
    ledgers = _ledger_names([tree.body for _, tree in code])
    for section, tree in code:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            if not _is_row_call(_attribute_chain(node.func), ledgers):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                made.append((first.value, section))
            elif isinstance(first, ast.JoinedStr):
                start = ""
                for piece in first.values:
                    if not isinstance(piece, ast.Constant):
                        break
                    start += piece.value
                made.append((start + "*", section))
            else:  # an id held in a variable: any claim could be it
                made.append(("*", section))
    return made


def section_of_claim(claim_id, made):
    """The section whose cells make ``claim_id``, from ``claim_sections``' list: the one that
    names it, else the one whose f-string start matches it longest; None if no cell makes it
    or two sections could."""
    exact = {section for claim, section in made if claim == claim_id}
    if not exact:
        starts = [
            (len(claim), section)
            for claim, section in made
            if claim.endswith("*") and claim_id.startswith(claim[:-1])
        ]
        longest = max((length for length, _ in starts), default=None)
        exact = {section for length, section in starts if length == longest}
    return exact.pop() if len(exact) == 1 else None


def _text(cell):
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


@dataclass
class Dependencies:
    """What a record's numbers depend on: ``toycore`` {unit: digest}, ``cells`` [[where,
    digest]] (the sliced code of each cell that feeds a row, in order), and ``key``, their
    hash (the cells' places left out: inserting a Markdown cell changes no number).
    ``constants`` {name: value as written}: the literal constants the cells name, which count
    by their values in the cells' code; kept to say which changed, not in the key."""

    toycore: dict
    cells: list
    constants: dict = field(default_factory=dict)

    @property
    def key(self):
        return _digest(
            json.dumps([sorted(self.toycore.items()), [digest for _, digest in self.cells]])
        )

    def to_json(self):
        data = dict(key=self.key, toycore=self.toycore, cells=self.cells)
        return {**data, "constants": self.constants} if self.constants else data

    @classmethod
    def from_json(cls, data):
        return cls(
            dict(data["toycore"]),
            [list(cell) for cell in data["cells"]],
            dict(data.get("constants", {})),
        )


def changes(old, new, limit=8):
    """What changed from ``old`` to ``new`` (Dependencies), as short phrases: the toycore
    functions and constants changed, added or gone, then the cells."""
    phrases = []
    for name in sorted(set(old.constants) & set(new.constants)):
        if old.constants[name] != new.constants[name]:
            short = name.removeprefix(PACKAGE_NAME + ".")
            phrases.append(f"{short} ({old.constants[name]} → {new.constants[name]})")
    for name in sorted(set(old.toycore) | set(new.toycore)):
        short = name.removeprefix(PACKAGE_NAME + ".")
        if name not in old.toycore:
            phrases.append(f"{short} (new)")
        elif name not in new.toycore:
            phrases.append(f"{short} (no longer used)")
        elif old.toycore[name] != new.toycore[name]:
            phrases.append(short)
    old_digests = [digest for _, digest in old.cells]
    new_digests = [digest for _, digest in new.cells]
    if old_digests != new_digests:
        kept = set(old_digests)
        edited = [where for where, digest in new.cells if digest not in kept]
        gone = len([d for d in old_digests if d not in set(new_digests)]) - len(edited)
        phrases += [f"the code of {where}" for where in edited]
        if gone > 0:
            phrases.append(f"{gone} cell(s) that fed rows no longer do")
        if not edited and gone <= 0:
            phrases.append("the order of the chapter's cells")
    if len(phrases) > limit:
        phrases = phrases[: limit - 1] + [f"and {len(phrases) - limit + 1} more"]
    return phrases


def changes_in(old_code, new_code, roots, limit=8):
    """What changed, from ``old_code`` to ``new_code`` (Code), in the closure of ``roots``."""
    return changes(
        Dependencies(old_code.closure(roots), []), Dependencies(new_code.closure(roots), []), limit
    )


def notebook_dependencies(code, cells, profile, rule=RULE):
    """The Dependencies of a chapter whose code cells are ``cells`` (nbformat dicts, in order,
    Markdown included to name sections), run under ``profile``: see the module's docstring.
    ``rule``: one of RULES, an earlier one to check a list made under it against its commit."""
    statements = []  # (cell index, where, statement)
    section, counts, places = "setup", {}, {}
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            section = section_of(_text(cell)) or section
            continue
        if cell["cell_type"] != "code":
            continue
        counts[section] = counts.get(section, 0) + 1
        places[index] = (
            f"§{section} cell {counts[section]}"
            if section[0].isdigit()
            else f"the {section} cell {counts[section]}"
        )
        try:
            tree = ast.parse(_text(cell))
        except SyntaxError:
            tree = ast.parse("")
        statements += [(index, stmt) for stmt in tree.body]

    namespace = {}  # the cells' imports, to resolve names into toycore
    for _, stmt in statements:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bound = alias.asname or alias.name.split(".")[0]
                target = alias.name if alias.asname else alias.name.split(".")[0]
                namespace.setdefault(bound, []).append(("module", target))
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level:
            for alias in stmt.names:
                namespace.setdefault(alias.asname or alias.name, []).append(
                    ("from", stmt.module, alias.name)
                )
    ledgers = {
        target.id
        for _, stmt in statements
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.value, ast.Call)
        and code.resolve_names(namespace, stmt.value.func)[0] & {"toycore.claims.Ledger"}
        for target in stmt.targets
        if isinstance(target, ast.Name)
    }
    slicer = _Slicer(code, namespace, ledgers, rule)
    kept = slicer.slice([stmt for _, stmt in statements])

    units, attributes, per_cell = set(), set(), {}
    inline = _InlineConstants(code, namespace)
    for (index, stmt), keep in zip(statements, kept):
        if not keep:
            continue
        stmt = slicer.without_words(stmt)
        if _constants_by_value(rule):
            stmt = inline.visit(stmt)
        found, loose = code.resolve_names(namespace, stmt)
        units |= found
        attributes |= loose
        per_cell.setdefault(index, []).append(serialise(stmt))
    cell_digests = [
        [places[index], _digest("\n".join(per_cell[index]))] for index in sorted(per_cell)
    ]
    return Dependencies(
        code.closure(units, attributes, profile, rule),
        cell_digests,
        dict(sorted(inline.inlined.items())),
    )


class _Slicer:
    """Which statements of a chapter feed its ledger rows (see the module's docstring)."""

    def __init__(self, code, namespace, ledgers, rule=RULE):
        self.code, self.namespace, self.ledgers = code, namespace, ledgers
        # an import statement counts only the names that kept statements use, so that
        # importing one more name for a figure or a glued sentence stales nothing; the first
        # rule counted each statement whole
        self.whole_imports = rule == RULES[0]
        self.scoped = _scopes_own_names(rule)
        self._imported_used = {}  # id(import statement) -> the names it binds that are used

    def _neutral_call(self, call):
        func = call.func
        if isinstance(func, ast.Name) and func.id in DISPLAY_CALLS:
            return True
        chain = _attribute_chain(func)
        if chain and chain[0] in self.ledgers and chain[1] and chain[1][0] not in ROW_FORMS:
            return True  # ledger.table(), ledger.save(), ledger.correction(...)
        if chain and chain[0] in self.namespace:
            targets = self._targets(chain)
            return bool(targets) and all(_is_neutral(t) for t in targets)
        return False

    def _targets(self, chain):
        """The dotted names a chain reaches (units or modules), for neutrality."""
        entries = []
        for entry in self.namespace[chain[0]]:
            if entry[0] == "from":
                found = self.code._member(entry[1], entry[2])
                entries += found or [("module", f"{entry[1]}.{entry[2]}")]
            else:
                entries.append(entry)
        return [target for _, target in entries]

    def _adds_row(self, stmt):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                chain = _attribute_chain(node.func)
                if _is_row_call(chain, self.ledgers):
                    return True
        return False

    def _is_display(self, stmt):
        if isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Call):
                return self._neutral_call(stmt.value)
            return True  # a bare value, shown by Jupyter
        return False

    def slice(self, statements):
        """[bool] per statement: kept, because it adds a row, may change state (a bare call
        that is not a display), or defines a name that a kept statement later uses."""
        keep = [
            self._adds_row(s)
            or (
                isinstance(s, ast.Expr)
                and isinstance(s.value, ast.Call)
                and not self._is_display(s)
            )
            for s in statements
        ]
        needed = set()
        for k in range(len(statements) - 1, -1, -1):
            stmt = statements[k]
            # a call on an imported module or on the ledger changes no variable a row reads
            modules = (set(self.namespace) | self.ledgers) if self.scoped else ()
            defines = _defines(stmt, modules, self.scoped)
            if not keep[k] and not self._is_display(stmt) and defines & needed:
                keep[k] = True
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self._imported_used[id(stmt)] = defines & needed
            if keep[k] and self.scoped:  # what it reads before binding it itself
                needed = (needed - _bound([stmt])) | _free([self.without_words(stmt)])
            elif keep[k]:
                needed |= _uses(self.without_words(stmt))
        return keep

    def without_words(self, stmt):
        """``stmt`` with its rows' words and its displays left out (a copy); an import, with
        only the names that kept statements use (once ``slice`` has seen it)."""
        ledgers, slicer = self.ledgers, self
        used = self._imported_used.get(id(stmt))
        if used is not None and not self.whole_imports:
            trimmed = _copy(stmt)
            trimmed.names = [
                alias
                for alias in trimmed.names
                if (alias.asname or alias.name.split(".")[0]) in used
            ]
            return trimmed

        class Strip(ast.NodeTransformer):
            def visit_Call(self, node):
                self.generic_visit(node)
                chain = _attribute_chain(node.func)
                if _is_row_call(chain, ledgers):
                    node.args = [a for k, a in enumerate(node.args) if k not in ROW_TEXT_POSITIONS]
                    node.keywords = [k for k in node.keywords if k.arg not in ROW_TEXT_KEYWORDS]
                return node

            def generic_visit(self, node):
                super().generic_visit(node)
                for name in ("body", "orelse", "finalbody"):
                    value = getattr(node, name, None)
                    if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                        kept = [s for s in value if not slicer._is_display(s)]
                        setattr(node, name, kept or [ast.Pass()])
                return node

        return Strip().visit(_copy(stmt))


def _is_row_call(chain, ledgers):
    """Whether a call's function, as an attribute chain, is a ledger's row form."""
    return bool(chain and chain[0] in ledgers and chain[1] and chain[1][0] in ROW_FORMS)


def _defines(stmt, modules=(), scoped=True):
    """The names a statement binds or changes (``x[k] = v``, ``x.a = v`` and ``x.append(v)``
    change x, unless x is one of ``modules``: a call of a module's function changes no
    variable). A comprehension's variables are its own: they bind nothing outside it.
    ``scoped=False``: the rule before (RULES), which counted them, and saw ``x.append(v)``
    change x only where it stands alone, not inside a block."""
    own = set()  # the comprehensions' variables
    if scoped:
        own = {
            id(name)
            for node in ast.walk(stmt)
            if isinstance(node, ast.comprehension)
            for name in ast.walk(node.target)
        }
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in own:
            names.add(node.id)
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            base = node
            while isinstance(base, (ast.Subscript, ast.Attribute)):
                base = base.value
            if isinstance(base, ast.Name):
                names.add(base.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
    for node in ast.walk(stmt) if scoped else [stmt]:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            chain = _attribute_chain(node.value.func)
            if chain and chain[1] and chain[0] not in modules:  # x.append(v) changes x
                names.add(chain[0])
    return names


def _scopes_own_names(rule):
    return RULES.index(rule) >= RULES.index("own names scoped")


def _constants_by_value(rule):
    return RULES.index(rule) >= RULES.index("constants by value")


def _drops_decorators(rule):
    return RULES.index(rule) >= RULES.index("neutral decorators dropped")


def _drops_neutral_calls(rule):
    return RULES.index(rule) >= RULES.index("neutral calls dropped")


class _InlineConstants(ast.NodeTransformer):
    """A chapter's statement with each name of a literal toycore constant replaced by the
    constant's value (``Code.literal_constant``), as if the chapter had written it out."""

    def __init__(self, code, namespace):
        self.code, self.namespace = code, namespace
        self.inlined = {}  # constant's unit name -> its value as written

    def _inline(self, node):
        found = self.code.literal_constant(self.namespace, node)
        if found is None:
            return None
        name, value = found
        self.inlined[name] = ast.unparse(value)
        return ast.copy_location(_copy(value), node)

    def visit_Attribute(self, node):
        return self._inline(node) or self.generic_visit(node)

    def visit_Name(self, node):
        return (isinstance(node.ctx, ast.Load) and self._inline(node)) or node

    def visit_JoinedStr(self, node):
        """An f-string's ``{constant}``, once inlined, reads as the text it formats to, as the
        same string with the number written in would: f"p = {ex.P}" as "p = 0.045"."""
        before = serialise(node)
        self.generic_visit(node)
        if serialise(node) == before:
            return node  # nothing inlined: as the chapter wrote it
        values = []
        for value in node.values:
            if (
                isinstance(value, ast.FormattedValue)
                and isinstance(value.value, ast.Constant)
                and value.conversion == -1
                and value.format_spec is None
            ):
                value = ast.Constant(str(value.value.value))
            if values and isinstance(value, ast.Constant) and isinstance(values[-1], ast.Constant):
                value = ast.Constant(values.pop().value + value.value)
            values.append(value)
        if len(values) == 1 and isinstance(values[0], ast.Constant):
            return ast.copy_location(values[0], node)  # no placeholder left: a plain string
        node.values = values
        return node


def _ledger_names(bodies):
    """The names bound to a ``Ledger(...)`` in these cells' statements."""
    names = set()
    for body in bodies:
        for stmt in body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                chain = _attribute_chain(stmt.value.func)
                if chain and (chain[1] or [chain[0]])[-1] == "Ledger":
                    names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return names


def _bound(statements):
    """The names ``statements`` certainly rebind (plain assignment, import, def): an earlier
    definition of them is not needed after them."""
    names = set()
    for stmt in statements:
        if isinstance(stmt, ast.Assign) or (isinstance(stmt, ast.AnnAssign) and stmt.value):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if isinstance(target, (ast.Name, ast.Tuple, ast.List)):
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in stmt.names}
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
    return names


def _local(stmt):
    """The rule before (RULES): names a statement binds for its own use only, wherever they
    are read in it: loop and comprehension variables, the arguments of its lambdas and
    functions, ``with ... as`` names."""
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            names |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            names |= {n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name)}
    return names


def _free(statements, scoped=True):
    """The names ``statements`` read before (or without) binding them themselves.
    ``scoped=False``: as the rule before read them (RULES)."""
    free, bound = set(), set()
    for stmt in statements:
        free |= _reads(stmt, scoped) - bound
        bound |= _bound([stmt])
    return free


def _reads(stmt, scoped=True):
    """The names one statement reads before binding them itself. A block is read in order:
    ``if run: s = f(); g(s)`` and ``for k in ks: s = f(k); g(s)`` read no earlier s (taken
    whole, they would, and slicing would pull in whatever earlier cell last bound s, with all
    that cell needs); a loop body that reads s before binding it reads the earlier s."""
    if isinstance(stmt, (ast.If, ast.While)):
        return (
            _expression_reads(stmt.test, scoped)
            | _free(stmt.body, scoped)
            | _free(stmt.orelse, scoped)
        )
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        target = {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
        return (
            _expression_reads(stmt.iter, scoped)
            | (_free(stmt.body, scoped) - target)
            | _free(stmt.orelse, scoped)
        )
    if scoped and isinstance(stmt, (ast.With, ast.AsyncWith)):
        named = {
            n.id
            for item in stmt.items
            if item.optional_vars is not None
            for n in ast.walk(item.optional_vars)
            if isinstance(n, ast.Name)
        }
        context = set().union(*(_expression_reads(i.context_expr) for i in stmt.items))
        return context | (_free(stmt.body) - named)
    if scoped and isinstance(stmt, ast.Try):
        return set().union(
            _free(stmt.body),
            *(_free(handler.body) - {handler.name} for handler in stmt.handlers),
            _free(stmt.orelse),
            _free(stmt.finalbody),
        )
    return _expression_reads(stmt, scoped)


def _expression_reads(node, scoped=True):
    """The names a node reads from the scope it stands in: a comprehension's variables, a
    lambda's or a function's arguments and a function's own assignments are theirs, but a
    comprehension's first iterable, and defaults and decorators, are read outside them.
    ``scoped=False``: the rule before (RULES), which left out every name the node binds for
    its own use wherever it is read, an outer one of the same name included."""
    if not scoped:
        return _uses(node) - _local(node)
    reads = set()

    def stored(target):
        return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}

    def visit(node, own):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id not in own:
                reads.add(node.id)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = set(own)
            for k, generator in enumerate(node.generators):
                visit(generator.iter, own if k == 0 else inner)  # the first, outside
                inner |= stored(generator.target)
                for condition in generator.ifs:
                    visit(condition, inner)
            for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
                visit(part, inner)
        elif isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            for default in [*arguments.defaults, *filter(None, arguments.kw_defaults)]:
                visit(default, own)
            for decorator in getattr(node, "decorator_list", []):
                visit(decorator, own)
            inner = own | {a.arg for a in ast.walk(arguments) if isinstance(a, ast.arg)}
            body = node.body if isinstance(node.body, list) else [node.body]
            declared = {
                name
                for statement in body
                for n in ast.walk(statement)
                if isinstance(n, (ast.Global, ast.Nonlocal))
                for name in n.names
            }
            inner |= {
                n.id
                for statement in body
                for n in ast.walk(statement)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            } - declared
            for statement in body:
                visit(statement, inner)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, own)

    visit(node, frozenset())
    return reads


def _uses(stmt):
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
