"""The ``fusecut`` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from optimizer.errors import FusecutError
from optimizer.plan.render import human_bytes, to_dot, to_svg

if TYPE_CHECKING:  # the commands import what they use, so that --help starts fast
    from optimizer.analysis.shapes import Bound
    from optimizer.ir.inputs import InputMeta
    from optimizer.ir.nvtext import ParsedDefinition

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan GPU fusions so that the fewest bytes cross global memory.")
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
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
    from optimizer.ir.nvtext import parse_text

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
    from optimizer.analysis.shapes import bind

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


def input_metadata(parsed: ParsedDefinition, inputs: str | None) -> list[InputMeta]:
    """Input metadata from --inputs (JSON text or @file) or the repro's ``inputs = [...]``."""
    import json

    from optimizer.ir.wire import meta_from_json

    if inputs is None:
        if parsed.inputs is None:
            fail("no input metadata: the file has no `inputs = [...]` list; pass --inputs "
                 "'[{\"shape\": [...], \"dtype\": \"float32\"}, ...]'")
        return parsed.inputs
    try:
        text = Path(inputs[1:]).read_text() if inputs.startswith("@") else inputs
        data = json.loads(text)
        if not isinstance(data, list):
            fail("--inputs must be a JSON list, one entry per fusion input")
        return [meta_from_json(d) for d in data]
    except (OSError, ValueError) as e:
        fail(f"--inputs: {e}")
    except FusecutError as e:
        fail(f"--inputs: {e}")


@app.command()
def plan(file: str = typer.Argument(..., help="nvFuser repro or definition ('-' for stdin)"),
         segmenter: str = typer.Option("cpsat", help="cpsat | greedy | mincut"),
         time_limit: float = typer.Option(5.0, "--time-limit", help="solver seconds"),
         device: str = typer.Option("H100", help="device profile: H100, H200, A100"),
         inputs: str = typer.Option(None, help="input metadata as JSON (or @file)"),
         as_json: bool = typer.Option(False, "--json", help="print the Plan JSON alone"),
         num_streams: int = typer.Option(4, help="CUDA streams a stream-parallel loop uses"),
         svg: Path = typer.Option(None, help="write a picture of the segments"),
         dot: Path = typer.Option(None, help="write the segment graph as Graphviz DOT")):
    """Plan a fusion: segments, boundary tensors and bytes against greedy and the lower bound."""
    import json

    from optimizer.planner import PlanOptions, make_plan

    parsed = read_definition(file)
    metas = input_metadata(parsed, inputs)
    try:
        result = make_plan(parsed.fusion, metas, PlanOptions(segmenter=segmenter,
                                                             time_limit_s=time_limit,
                                                             device=device,
                                                             num_streams=num_streams)).to_json()
    except FusecutError as e:
        fail(str(e))
    for path, draw, what in ((svg, to_svg, "picture"), (dot, to_dot, "DOT graph")):
        if path:
            try:
                path.write_text(draw(result))
            except OSError as e:
                fail(f"cannot write {path}: {e.strerror}")
            err.print(f"wrote the {what} to {path.resolve()}", soft_wrap=True)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
        return
    print_plan(result)


def print_plan(result: dict) -> None:
    segs = Table(title=f"plan {result['plan_id']} ({result['segmenter']}, "
                       f"{result['solver']['status']})")
    for col in ("#", "kind", "ops", "recomputed", "reads", "writes", "read", "write", "est"):
        segs.add_column(col, justify="right" if col in ("read", "write", "est") else "left")
    for s in result["segments"]:
        segs.add_row(str(s["index"]), s["kind"], str(len(s["ops"])),
                     str(len(s["recomputed_ops"])),
                     ", ".join(t["tensor"] for t in s["inputs"]),
                     ", ".join(t["tensor"] for t in s["outputs"]),
                     human_bytes(s["read_bytes"]), human_bytes(s["write_bytes"]),
                     f"{s['est_time_s'] * 1e6:.0f} us")
    out.print(segs)
    if result["boundaries"]:
        b = Table(title="boundary tensors")
        for col in ("tensor", "shape", "stored as", "dtype", "bytes", "from", "to", "why"):
            b.add_column(col)
        for t in result["boundaries"]:
            b.add_row(t["tensor"], "x".join(map(str, t["shape"])),
                      "x".join(map(str, t["compact_shape"])) or "scalar", t["dtype"],
                      human_bytes(t["bytes"]), str(t["producer"]),
                      ", ".join(map(str, t["consumers"])), t["reason"])
        out.print(b)
    else:
        out.print("no tensor crosses between segments")
    tot, base = result["totals"], result["baseline"]
    summary = Table(title="totals", show_header=True)
    for col in ("", "I/O bytes", "segments", "est time"):
        summary.add_column(col)
    summary.add_row("fusecut", human_bytes(tot["io_bytes"]), str(tot["segments"]),
                    f"{tot['est_time_s'] * 1e6:.0f} us")
    summary.add_row("greedy (nvFuser-style)", human_bytes(base["io_bytes"]), str(base["segments"]),
                    f"{base['est_time_s'] * 1e6:.0f} us")
    summary.add_row("lower bound", human_bytes(tot["lower_bound_bytes"]), "",
                    f"{tot['floor_s'] * 1e6:.0f} us")
    out.print(summary)
    out.print(f"io_ratio {tot['io_ratio']:.3f}; saved {human_bytes(base['saved_bytes'])} against "
              f"greedy; solver {result['solver']['status']} in {result['solver']['wall_s']:.2f} s"
              f" ({result['solver']['message']})")
    if result.get("host_program"):  # stream-parallel axes (seed 004): the host program
        out.print("host program:")
        out.print(result["host_program"], markup=False, highlight=False, soft_wrap=True)


@app.command()
def codegen(file: str = typer.Argument(..., help="nvFuser repro or definition ('-' for stdin)"),
            out_dir: Path = typer.Option(..., "--out", help="directory for the .cu files"),
            inputs: str = typer.Option(None, help="input metadata as JSON (or @file)"),
            compile_check: bool = typer.Option(False, "--compile", help="compile with NVRTC"),
            arch: str = typer.Option("sm_90", help="architecture for --compile")):
    """Write the CUDA source of every generated segment, with its launch parameters."""
    import json

    from codegen import generate_segment
    from optimizer.planner import make_plan

    parsed = read_definition(file)
    try:
        plan_ = make_plan(parsed.fusion, input_metadata(parsed, inputs))
    except FusecutError as e:
        fail(str(e))
    out_dir.mkdir(parents=True, exist_ok=True)
    table = Table(title=f"generated kernels in {out_dir}")
    for col in ("segment", "kind", "file", "kernels", "grid x block"):
        table.add_column(col)
    for seg in plan_.segments:
        sk = generate_segment(plan_, seg)
        if not sk.kernels:
            table.add_row(str(seg.index), seg.kind.value, "(torch: library or fallback)", "", "")
            continue
        path = out_dir / f"segment{seg.index}_{seg.kind.value}.cu"
        path.write_text(sk.source)
        launch = {"segment": seg.index, "kind": seg.kind.value, "notes": sk.notes,
                  "workspaces": [{"name": w.name, "bytes": w.nbytes} for w in sk.workspaces],
                  "kernels": [{"name": k.name, "grid": k.grid, "block": k.block,
                               "shared_memory": k.smem,
                               "params": [{"kind": p.kind, "name": p.name, "type": p.ctype}
                                          for p in k.params]} for k in sk.kernels]}
        path.with_suffix(".json").write_text(json.dumps(launch, indent=1) + "\n")
        if compile_check:
            from runtime.compile import compile_cubin

            compile_cubin(sk.source, arch, sk.kernels[0].name)
        table.add_row(str(seg.index), seg.kind.value, path.name,
                      ", ".join(k.name for k in sk.kernels),
                      "; ".join(f"{k.grid} x {k.block}" for k in sk.kernels))
    out.print(table)


@app.command()
def execute(file: str = typer.Argument(..., help="nvFuser repro with an inputs list"),
            device: str = typer.Option(None, help="cuda or cpu (default: cuda if available)"),
            scale: int = typer.Option(0, help="shrink inputs to at most this many elements"),
            check: bool = typer.Option(True, help="compare with the torch reference")):
    """Run a repro on inputs made like its ``inputs = [...]``; print per-segment times."""
    import torch

    from optimizer.ir.inputs import scale_metas
    from optimizer.planner import make_plan
    from runtime.reference import run_reference
    from runtime.run import run_plan
    from runtime.tensors import make_input

    parsed = read_definition(file)
    metas = input_metadata(parsed, None)
    if scale:
        metas = scale_metas(metas, scale)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        fail(f"--device {device}: not a device; use cuda, cuda:N or cpu")
    if kind not in ("cuda", "cpu"):
        fail(f"--device {device}: fusecut runs on cuda or cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        fail(f"--device {device}: no CUDA GPU is available here; use --device cpu to run the "
             f"torch reference segment by segment")
    try:
        plan_ = make_plan(parsed.fusion, metas)
        args = [make_input(m, device) for m in metas]
        result = run_plan(plan_, args, timed=True)
    except FusecutError as e:
        fail(str(e))
    except RuntimeError as e:  # from torch or the CUDA driver: its first line says what
        fail(f"execution on {device} failed: {str(e).strip().splitlines()[0]}", 1)
    table = Table(title=f"execution on {device} ({result.backend})")
    for col in ("segment", "kind", "time", "bytes", "bandwidth"):
        table.add_column(col, justify="right")
    for t in result.timings:
        table.add_row(str(t.index), t.kind, f"{t.seconds * 1e6:.0f} us", human_bytes(t.bytes),
                      f"{t.bytes / max(t.seconds, 1e-12) / 1e9:.0f} GB/s")
    out.print(table)
    for name, value in zip(parsed.fusion.outputs, result.outputs):
        out.print(f"{name}: {list(value.shape)} {value.dtype}")
    if check:
        want = run_reference(parsed.fusion, args)
        worst = max(float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
                    for a, b in zip(result.outputs, want))
        if result.backend == "reference":  # the CPU path runs each segment through torch
            out.print(f"largest difference of the segment-by-segment run from the whole-fusion "
                      f"torch reference: {worst:.3g} (on the CPU each segment runs the torch "
                      f"reference; this checks the segmentation, not generated kernels)")
        else:
            out.print(f"largest difference of the generated kernels from the torch reference: "
                      f"{worst:.3g}")


@app.command()
def serve(host: str = typer.Option("127.0.0.1", help="address to bind (loopback by default)"),
          port: int = typer.Option(8000, help="TCP port"),
          workers: int = typer.Option(1, help="uvicorn worker processes"),
          db: str = typer.Option(None, help="plan cache file (SQLite); default "
                                            "~/.local/share/fusecut/plans.sqlite"),
          cache: str = typer.Option(None, envvar="FUSECUT_CACHE_URL",
                                    help="plan cache: an SQLite path, or postgresql://... to "
                                         "share one with other replicas (overrides --db)"),
          gpus: str = typer.Option(None, envvar="FUSECUT_GPUS",
                                   help="a GPU worker per device: all, or indices as 0,1 "
                                        "(default: one worker)"),
          api_key: str = typer.Option(None, envvar="FUSECUT_API_KEY",
                                      help="require 'Authorization: Bearer KEY' for executions"),
          log_level: str = typer.Option("info", help="uvicorn log level"),
          access_log: bool = typer.Option(False, help="log every request (metrics count them "
                                                      "either way)")):
    """Run the HTTP service (settings from FUSECUT_* environment variables and these options)."""
    import os
    import tempfile

    import uvicorn

    from service.settings import Settings

    # Settings reach every uvicorn worker process through the environment.
    for name, value in (("FUSECUT_DB_PATH", db), ("FUSECUT_API_KEY", api_key),
                        ("FUSECUT_CACHE_URL", cache), ("FUSECUT_GPUS", gpus)):
        if value is not None:
            os.environ[name] = value
    try:
        from runtime.worker_pool import parse_gpus

        parse_gpus(Settings.from_env().gpus)  # refuse bad values here, not in every worker
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each process writes its samples here; /metrics adds them up.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fusecut-metrics-")
    uvicorn.run("service.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, access_log=access_log)


@app.command("ray-serve")
def ray_serve(address: str = typer.Option(None, help="a running Ray cluster (auto, or "
                                                       "HOST:PORT); default: start one here"),
              host: str = typer.Option("127.0.0.1", help="address Serve's HTTP proxy binds"),
              port: int = typer.Option(8000, help="Serve's HTTP port"),
              cache: str = typer.Option(None, envvar="FUSECUT_CACHE_URL",
                                        help="plan cache shared by the replicas: "
                                             "postgresql://... (or an SQLite path on one node)"),
              plan_replicas: int = typer.Option(2, help="planning replicas (CPU)"),
              min_replicas: int = typer.Option(None, help="autoscale planning replicas from "
                                                          "this many..."),
              max_replicas: int = typer.Option(None, help="...to this many"),
              plan_cpus: float = typer.Option(1.0, help="CPUs Ray reserves per planning "
                                                        "replica"),
              execute_replicas: int = typer.Option(1, help="execute replicas"),
              execute_gpus: float = typer.Option(None, help="GPUs per execute replica "
                                                            "(default: 1 if the cluster has "
                                                            "GPUs, else 0: the CPU path)"),
              num_cpus: int = typer.Option(None, help="a local cluster's CPUs (default: all)"),
              object_store_mb: int = typer.Option(256, help="a local cluster's object store")):
    """Serve the HTTP API on Ray Serve: planning replicas behind Serve's proxy, executions on
    GPU replicas, one shared plan cache (needs the 'ray' extra)."""
    import os

    try:
        from service import ray_serve as rs
    except ImportError as e:
        fail(f"ray-serve needs Ray Serve: pip install 'fusecut[ray]' ({e})")
    if cache is not None:
        os.environ["FUSECUT_CACHE_URL"] = cache

    def ready(url: str, gpus: float) -> None:
        err.print(f"fusecut on Ray Serve at {url} ({plan_replicas} planning replicas, "
                  f"{execute_replicas} execute replicas with {gpus:g} GPU each)")

    rs.run(address, host, port, plan_replicas, min_replicas, max_replicas, plan_cpus,
           execute_replicas, execute_gpus, num_cpus, object_store_mb, ready)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
