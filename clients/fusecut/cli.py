"""The ``fusecut`` command line."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from optimizer.analysis.shapes import Bound, bind
from optimizer.errors import FusecutError
from optimizer.ir.nvtext import ParsedDefinition, parse_text

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan GPU fusions so that the fewest bytes cross global memory.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


@app.callback()
def _commands() -> None:
    """fusecut: segmentation and rematerialization for GPU fusions."""


def read_definition(path: str) -> ParsedDefinition:
    """Parse FILE (or '-' for standard input); exit 2 with a clear message if it is malformed."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    try:
        return parse_text(text)
    except FusecutError as e:
        fail(str(e))


def fail(message: str, code: int = 2):
    err.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


def _shape(bound: Bound | None, name: str) -> str:
    if bound is None:
        return ""
    shape = bound.shapes.get(name)
    return "x".join(map(str, shape)) if shape else "scalar"


@app.command()
def check(file: str = typer.Argument(..., help="nvFuser repro or definition ('-' for stdin)")):
    """Parse a definition; print its inputs, ops and outputs with shapes and dtypes."""
    parsed = read_definition(file)
    fusion = parsed.fusion
    bound = None
    if parsed.inputs is not None:
        try:
            bound = bind(fusion, parsed.inputs)
        except FusecutError as e:
            fail(str(e))
    table = Table(title="inputs")
    for col in ("name", "dtype", "declared", "shape", "strides"):
        table.add_column(col)
    for name in fusion.inputs:
        if name in fusion.tensors:
            t = fusion.tensors[name]
            meta = bound.inputs[name] if bound else None
            table.add_row(name, t.dtype.value, str(list(t.declared_shape or ())),
                          _shape(bound, name), str(list(meta.strides)) if meta else "")
        else:
            table.add_row(name, fusion.scalars[name].dtype.value, "scalar", "", "")
    out.print(table)
    ops = Table(title=f"ops ({len(fusion.ops)})")
    for col in ("#", "op", "inputs", "outputs", "dtype", "shape"):
        ops.add_column(col)
    for i, op in enumerate(fusion.ops):
        outs = op.outputs
        ops.add_row(str(i), op.name, ", ".join(op.inputs), ", ".join(outs),
                    ", ".join(fusion.value_dtype(o).value for o in outs),
                    ", ".join(_shape(bound, o) for o in outs))
    out.print(ops)
    outputs = Table(title="outputs")
    for col in ("name", "dtype", "shape"):
        outputs.add_column(col)
    for name in fusion.outputs:
        outputs.add_row(name, fusion.tensors[name].dtype.value, _shape(bound, name))
    out.print(outputs)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
