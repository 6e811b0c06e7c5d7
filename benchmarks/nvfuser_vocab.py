"""How much of nvFuser's own vocabulary fusecut speaks: a reproducible parse-rate measure.

    python -m benchmarks.nvfuser_vocab --fuser /path/to/Fuser/.git [--commit REV] [--no-write]

From a checkout of NVIDIA/Fuser (a git directory; files are read with ``git show``, nothing is
checked out or imported) it extracts every *self-contained, straight-line, one-parameter
definition* in ``tests/python`` and ``benchmarks/python``, in the words of issue 13:

- a ``def f(fd)`` with exactly one parameter (no defaults, no ``*args``), at any depth;
- that defines a fusion: it calls ``fd.define_tensor`` / ``fd.ops.*`` / ``fd.add_output`` ...;
- that uses no name bound in an enclosing function (its test's locals and parameters, such as
  ``inputs`` or a parametrised ``dtype``); module-level names (``DataType``) are allowed;
- straight-line: its body is assignments, calls and a bare ``return`` (no loops or branches).

Each is parsed with fusecut's nvFuser-text parser (``ast``; nothing is executed: this is what
``fusecut check`` does), given small inputs (``tests.sample_inputs``), planned, run through the
plan and through the reference, and compared. The table (totals and every failure with its
one-line error) is printed and written to ``benchmarks/results/`` with the date and the commit.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass

ROOTS = ("tests/python/", "benchmarks/python/")
# ``fd.<attr>`` calls that make a function a fusion definition
DEFINING_ATTRS = frozenset({"define_tensor", "define_scalar", "define_vector", "ops",
                            "add_output", "from_pytorch"})
STRAIGHT_STMTS = (ast.Assign, ast.AnnAssign, ast.Expr, ast.Pass)
HEADER = "from nvfuser import DataType, FusionDefinition\n\n\n"
MAX_ELEMENTS = 1 << 24  # inputs larger than this (from declared extents) are planned, not run


@dataclass(frozen=True)
class Definition:
    path: str  # inside the Fuser repository
    line: int
    name: str
    text: str  # the function alone, dedented, decorators dropped, with the nvfuser import

    @property
    def label(self) -> str:
        return f"{self.path}:{self.line} {self.name}"


@dataclass(frozen=True)
class Outcome:
    definition: Definition
    stage: str  # "ran" or where it stopped: "parse", "bind", "plan", "run", "mismatch"
    error: str = ""

    @property
    def parsed(self) -> bool:
        return self.stage != "parse"


# ---- extraction -------------------------------------------------------------------------------


def _bound_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Names a function binds: its parameters, assignment targets and nested defs/classes."""
    a = fn.args
    names = {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    names |= {p.arg for p in (a.vararg, a.kwarg) if p is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node is not fn:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(al.asname or al.name).split(".")[0] for al in node.names}
    return names


def _is_one_parameter(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return (len(a.args) == 1 and not a.posonlyargs and not a.kwonlyargs and not a.vararg
            and not a.kwarg and not a.defaults)


def _defines_fusion(fn: ast.FunctionDef) -> bool:
    param = fn.args.args[0].arg
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == param and n.attr in DEFINING_ATTRS for n in ast.walk(fn))


def enclosing_names_used(fn: ast.FunctionDef, enclosing: list[ast.AST]) -> set[str]:
    """The names ``fn`` reads that an enclosing function binds (its test's locals)."""
    outer: set[str] = set()
    for scope in enclosing:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            outer |= _bound_names(scope)
    loads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return (loads - _bound_names(fn) - set(dir(builtins))) & outer


def is_straight_line(fn: ast.FunctionDef) -> bool:
    """No loops, branches or nested scopes: statements, then at most one final ``return``."""
    body = list(fn.body)
    if body and isinstance(body[-1], ast.Return):
        body.pop()
    return all(isinstance(s, STRAIGHT_STMTS) for s in body)


def definitions_in(path: str, source: str) -> list[Definition]:
    """The self-contained, straight-line, one-parameter fusion definitions of one file."""
    tree = ast.parse(source)
    out: list[Definition] = []

    def visit(node: ast.AST, enclosing: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, ast.FunctionDef) and _is_one_parameter(child)
                    and _defines_fusion(child) and not enclosing_names_used(child, enclosing)
                    and is_straight_line(child)):
                out.append(Definition(path, child.lineno, child.name, _function_text(source,
                                                                                      child)))
            visit(child, [*enclosing, child] if isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else enclosing)

    visit(tree, [])
    return out


def _function_text(source: str, fn: ast.FunctionDef) -> str:
    lines = source.splitlines()[fn.lineno - 1:fn.end_lineno]  # from `def`: decorators dropped
    return HEADER + textwrap.dedent("\n".join(lines)) + "\n"


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True,
                          text=True).stdout


def extract(git_dir: str, commit: str = "HEAD") -> tuple[str, list[Definition]]:
    """(full commit id, definitions) of a Fuser git directory at ``commit``."""
    full = _git(git_dir, "rev-parse", f"{commit}^{{commit}}").strip()
    paths = [p for p in _git(git_dir, "ls-tree", "-r", "--name-only", full).splitlines()
             if p.endswith(".py") and p.startswith(ROOTS)]
    defs: list[Definition] = []
    for path in sorted(paths):
        defs += definitions_in(path, _git(git_dir, "show", f"{full}:{path}"))
    return full, defs


# ---- measuring ------------------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def measure(d: Definition, max_elements: int = MAX_ELEMENTS) -> Outcome:
    """Parse (fusecut check), bind small inputs, plan, run the plan and the reference, compare.

    Definitions whose declared extents make an input larger than ``max_elements`` are planned
    but not run (stage "planned")."""
    import torch

    from fusecut.optimizer.ir import parse_text
    from fusecut.optimizer.ir.inputs import TensorMeta
    from fusecut.optimizer.planner import make_plan
    from fusecut.runtime.reference import run_reference
    from fusecut.runtime.run import run_plan
    from fusecut.runtime.tensors import make_input
    from tests.sample_inputs import sample_metas

    try:
        fusion = parse_text(d.text).fusion
    except Exception as e:  # noqa: BLE001 - every failure is a row of the table
        return Outcome(d, "parse", one_line(e))
    stage = "bind"
    try:
        metas = sample_metas(fusion)
        stage = "plan"
        plan = make_plan(fusion, metas)
        largest = max((m.stored_numel for m in metas if isinstance(m, TensorMeta)), default=0)
        if largest > max_elements:
            return Outcome(d, "planned", f"an input of {largest} elements (declared extents) is "
                                         f"too large to run here")
        stage = "run"
        args = [make_input(m, generator=torch.Generator().manual_seed(0)) for m in metas]
        fresh = [a.clone() if isinstance(a, torch.Tensor) and 0 not in a.stride() else a
                 for a in args]  # the reference may update aliased inputs in place
        ref = run_reference(fusion, fresh)
        got = run_plan(plan, args).outputs
        stage = "mismatch"
        for i, (a, b) in enumerate(zip(got, ref, strict=True)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise AssertionError(f"output {i}: {tuple(a.shape)} {a.dtype} from the plan, "
                                     f"{tuple(b.shape)} {b.dtype} from the reference")
            torch.testing.assert_close(a, b, equal_nan=True)
    except Exception as e:  # noqa: BLE001
        return Outcome(d, stage, one_line(e))
    return Outcome(d, "ran")


def report(commit: str, outcomes: list[Outcome]) -> tuple[str, str]:
    """(summary table, failures table) in markdown."""
    from benchmarks.common import markdown_table

    total = len(outcomes)
    stages = Counter(o.stage for o in outcomes)
    parsed = sum(o.parsed for o in outcomes)
    bound = parsed - stages["bind"]
    runnable = bound - stages["planned"]

    def pct(n: int, d: int) -> str:
        return f"{n}/{d} ({100 * n / d:.1f}%)" if d else "0/0"

    summary = markdown_table(["measure", "count"], [
        ["definitions (one parameter, self-contained, straight-line)", str(total)],
        ["parse (`fusecut check`)", pct(parsed, total)],
        ["bind small uniform inputs", pct(bound, parsed)],
        ["planned only (an input too large to run on CPU)", str(stages["planned"])],
        ["plan and run equal to the reference", pct(stages["ran"], runnable)],
    ])
    rows = [[o.definition.label, o.stage, o.error.replace("|", "\\|")]
            for o in outcomes if o.stage not in ("ran", "planned")]
    failures = markdown_table(["definition", "stopped at", "error"], rows) if rows else "none"
    return summary, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fuser", required=True, help="a NVIDIA/Fuser git directory")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ns = ap.parse_args(argv)
    commit, defs = extract(ns.fuser, ns.commit)
    outcomes = [measure(d) for d in defs]
    summary, failures = report(commit, outcomes)
    text = (f"NVIDIA/Fuser commit {commit}\n\n{summary}\n\n## Not yet\n\n{failures}\n")
    print(text)
    if not ns.no_write:
        from benchmarks.common import RESULTS, write_result

        path = write_result(f"nvfuser-vocab-{commit[:12]}", "cpu", "nvFuser vocabulary: "
                            "self-contained definitions that parse, plan and run", text,
                            "Produced by `python -m benchmarks.nvfuser_vocab --fuser <git dir>`.")
        print(f"written to {path.relative_to(RESULTS.parent.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
