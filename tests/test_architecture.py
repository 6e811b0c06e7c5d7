"""The package arrows of docs/architecture.md, held: every ``import fusecut...`` in the
package's rooms (clients/, optimizer/, codegen/, runtime/, service/; at the top of a module or
inside a function alike) goes one way.

    optimizer <- codegen <- runtime <- engine <- service / SDK / thunder
                            runtime <- wire <- service, the SDK's Client

``fusecut.version`` and ``fusecut.environment`` are leaves any layer may import. Inside
``optimizer`` each layer uses only those below it: ir < analysis (and profiles) < kinds <
segmenters < plan < planner. Modules import each other at their top without a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

from tests import rooms

LAYERS = ("optimizer", "codegen", "runtime", "engine", "wire", "service", "thunder", "dynamo",
          "version", "environment")
# layer -> the layers it may import (besides itself)
ALLOWED = {
    "version": set(),
    "optimizer": {"version"},
    "codegen": {"optimizer", "version"},
    "runtime": {"codegen", "optimizer", "version"},
    # the engine: plan, program and run in stages, the caches every door shares
    "engine": {"runtime", "codegen", "optimizer", "version"},
    "wire": {"runtime", "optimizer", "version"},
    "service": {"engine", "wire", "runtime", "codegen", "optimizer", "version"},
    # the SDK: FusionDefinition, the Client, the CLI (which starts the service: fusecut serve)
    "sdk": {"engine", "service", "wire", "runtime", "codegen", "optimizer", "version"},
    "thunder": {"sdk", "engine", "wire", "runtime", "codegen", "optimizer", "version"},
    # the torch.compile backend, a front like Thunder's executor (and sharing fusecut.fronts)
    "dynamo": {"sdk", "engine", "wire", "runtime", "codegen", "optimizer", "version"},
}
# fusecut.environment, the FUSECUT_* variables declared once: a leaf like version, which every
# other layer may import (issue 46)
ALLOWED = {k: v if k == "version" else v | {"environment"} for k, v in ALLOWED.items()}
ALLOWED["environment"] = {"version"}
OPTIMIZER_ORDER = ["ir", "analysis", "kinds", "segmenters", "plan", "planner"]


def imports(path: Path, top_only: bool = False) -> set[str]:
    """The fusecut modules ``path`` imports (``from a.b import c``: a.b.c if that is a module,
    else a.b)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in MODULES else node.module)
    return {n for n in found if n == "fusecut" or n.startswith("fusecut.")}


MODULES = rooms.modules()


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "sdk"


def optimizer_level(module: str) -> int | None:
    """Where an optimizer module sits in OPTIMIZER_ORDER: profiles beside analysis, the plan
    options (they name kinds and profiles) beside kinds, errors and the GC pause below ir."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "optimizer":
        return None
    name = parts[2]
    if name in ("errors", "gcpause"):
        return -1
    if name in ("profiles", "options"):
        return OPTIMIZER_ORDER.index("analysis" if name == "profiles" else "kinds")
    return OPTIMIZER_ORDER.index(name) if name in OPTIMIZER_ORDER else None


def arrows() -> list[tuple[str, str]]:
    return [(m, n) for m, p in sorted(MODULES.items()) for n in sorted(imports(p))
            if n in MODULES]


# The design card's top level (the user's words): the rooms a newcomer opens are the architecture
CARD = ["pyproject.toml", "service", "optimizer", "codegen", "runtime", "clients", "tests",
        "docker", "README.md"]


def test_the_repository_top_level_holds_the_cards_rooms():
    assert all((rooms.ROOT / name).exists() for name in CARD)
    assert not (rooms.ROOT / "src").exists()
    # one installed package, fusecut: clients/ its root, the other rooms its packages
    assert {n: r.name for n, r in rooms.ROOMS.items()} == {
        "fusecut": "clients", "fusecut.optimizer": "optimizer", "fusecut.codegen": "codegen",
        "fusecut.runtime": "runtime", "fusecut.service": "service"}
    assert all((r / "__init__.py").is_file() for r in rooms.ROOMS.values())


def test_the_tree_is_what_the_arrows_are_checked_on():
    names = set(MODULES)
    assert {"fusecut.optimizer.planner", "fusecut.codegen.kernel", "fusecut.runtime.program",
            "fusecut.service.app", "fusecut.thunder.executor", "fusecut.definition",
            "fusecut.version"} <= names
    assert len(arrows()) > 500


def test_every_arrow_goes_the_documented_way():
    wrong = [f"{m} -> {n}" for m, n in arrows()
             if layer(m) != layer(n) and layer(n) not in ALLOWED[layer(m)]]
    assert not wrong, "\n".join(wrong)


def test_inside_the_optimizer_each_layer_uses_only_those_below():
    wrong = []
    for m, n in arrows():
        a, b = optimizer_level(m), optimizer_level(n)
        if a is not None and b is not None and b > a:
            wrong.append(f"{m} -> {n}")
    assert not wrong, "\n".join(wrong)


def test_modules_import_each_other_at_the_top_without_a_cycle():
    graph = nx.DiGraph((m, n) for m, p in MODULES.items() for n in imports(p, top_only=True)
                       if n in MODULES and n != m and not MODULES[n].name == "__init__.py")
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles[:5]


@pytest.mark.parametrize("arrow", [("fusecut.optimizer.plan.plan", "fusecut"),
                                   ("fusecut.codegen.kernel", "fusecut.runtime.compile"),
                                   ("fusecut.service.core", "fusecut.definition")])
def test_the_check_sees_an_arrow_back_up(arrow):
    m, n = arrow
    assert layer(m) != layer(n) and layer(n) not in ALLOWED[layer(m)]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _owned_private_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, variables, attributes it
    assigns (``self._x = ...``), fields and parameters."""
    owned = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            owned.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            owned.add(node.attr)
        elif isinstance(node, ast.arg):
            owned.add(node.arg)
    return {n for n in owned if _private(n)}


def private_reaches(sources: dict[str, str]) -> list[str]:
    """Every place a module uses another fusecut module's private member: ``x._name`` where
    ``_name`` is defined by some other module and not by this one (``self._name`` and
    ``cls._name`` are a class's own), and ``from fusecut.other import _name``. By name, not by
    type: a module reaching into an object of another module's class through a private name it
    also defines itself is not seen."""
    trees = {m: ast.parse(text) for m, text in sources.items()}
    owned = {m: _owned_private_names(t) for m, t in trees.items()}
    owners: dict[str, set[str]] = {}
    for m, names in owned.items():
        for n in names:
            owners.setdefault(n, set()).add(m)
    found = []
    for m, tree in sorted(trees.items()):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) \
                    and node.attr not in owned[m] and node.attr in owners \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{m}:{node.lineno} {ast.unparse(node)} (defined in "
                             f"{', '.join(sorted(owners[node.attr]))})")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fusecut") \
                    and node.module != m:
                found += [f"{m}:{node.lineno} from {node.module} import {a.name}"
                          for a in node.names if _private(a.name)]
    return found


def test_no_module_reaches_into_another_modules_private_members():
    # issue 46: the Thunder region entered the SDK through definition._local_state() and
    # definition._warm; every door now goes through public names (fusecut.engine's handle)
    reaches = private_reaches({m: p.read_text() for m, p in MODULES.items()})
    assert not reaches, "\n".join(reaches)


def test_the_private_member_check_sees_a_reach():
    sources = {
        "fusecut.definition": "class FusionDefinition:\n    def _local_state(self):\n"
                              "        return self._entry\n",
        "fusecut.thunder.regions": "from fusecut.definition import _helper\n"
                                   "def run(definition):\n"
                                   "    return definition._local_state(), definition.handle\n",
    }
    reaches = private_reaches(sources)
    assert reaches == ["fusecut.thunder.regions:1 from fusecut.definition import _helper",
                       "fusecut.thunder.regions:3 definition._local_state (defined in "
                       "fusecut.definition)"], reaches


# issue 46, item 4: long rooms and functions are split by what they decide
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 100


def function_lengths(source: str) -> dict[str, int]:
    """The lines of every function and method (nested ones too), from ``def`` to its last
    line, by qualified name (``Class.method``, ``outer.inner``)."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    lengths[name] = max(lengths.get(name, 0), lines)
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_no_module_or_function_is_too_long():
    too_long = []
    for m, p in sorted(MODULES.items()):
        text = p.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{m}: {lines} lines (at most {MAX_MODULE_LINES})")
        too_long += [f"{m}.{name}: {n} lines (at most {MAX_FUNCTION_LINES} a function)"
                     for name, n in sorted(function_lengths(text).items())
                     if n > MAX_FUNCTION_LINES]
    assert not too_long, "\n".join(too_long)


def test_the_length_check_measures_nested_functions_and_methods():
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    source = (f"def flat():\n{body}"
              f"class Box:\n    def method(self):\n        def inner():\n"
              f"            return 1\n{body.replace('    ', '        ')}"
              f"        return inner\n")
    assert function_lengths(source) == {"flat": 101, "Box.method": 104, "Box.method.inner": 2}
