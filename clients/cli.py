"""The ``fusecut`` command line."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fusecut.cli_tables import print_definition, print_execution, print_plan
from fusecut.optimizer.errors import FusecutError, counted
from fusecut.optimizer.options import (
    DEVICE,
    NUM_STREAMS,
    SEGMENTER,
    TIME_LIMIT_S,
    Option,
    checked,
)
from fusecut.optimizer.plan.render import to_dot, to_svg

if TYPE_CHECKING:  # the commands import what they use, so that --help starts fast
    from fusecut.optimizer.analysis.shapes import Bound
    from fusecut.optimizer.ir.inputs import InputMeta
    from fusecut.optimizer.ir.nvtext import ParsedDefinition

# plain help (no rich panels): they tagged every option with its Python type and cut long lines
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Plan GPU fusions so that the fewest bytes cross global memory.")
# no markup: file names, literals and messages are the user's text ("[/x]" is no tag)
out = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, markup=False)
# the largest file (or standard input) read: the service's largest POST /v1/plan body
MAX_FILE_BYTES = 16 * 1024 * 1024
CPU_ELEMENTS = 1 << 20  # execute on the CPU: inputs scaled to at most this many elements

# FILE is described in each command's text: an argument's own help line shows a type tag
FILE = typer.Argument(..., metavar="FILE", hidden=True)
INPUTS = typer.Option(None, "--inputs", metavar="JSON",
                      help="input metadata as JSON ('@file' to read it from a file), like "
                           "'[{\"shape\": [8, 16], \"dtype\": \"float32\"}]'")
AS_JSON = typer.Option(False, "--json", help="print JSON instead of tables")


def _version(value: bool) -> None:
    if value:
        from fusecut.version import __version__

        out.print(f"fusecut {__version__}")
        raise typer.Exit()


@app.callback()
def _commands(version: bool = typer.Option(False, "--version", callback=_version,
                                           is_eager=True, help="print the version and exit")
              ) -> None:
    """fusecut: segmentation and rematerialization for GPU fusions."""


def read_text(path: str, what: str | None = None, limit: int = MAX_FILE_BYTES) -> str:
    """The text of file ``path`` ('-': standard input), at most ``limit`` bytes of UTF-8; exit
    2 with a one-line message otherwise (issue 32: ``check /dev/zero`` read without end, into
    a MemoryError)."""
    what = what or path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        fail(f"cannot read {what}: {e.strerror}")
    if len(data) > limit:
        fail(f"cannot read {what}: it is larger than {limit / 2**20:g} MiB, the most fusecut "
             f"reads (the service's largest plan request)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"cannot read {what}: it is not UTF-8 text")


def read_definition(path: str) -> ParsedDefinition:
    """Parse FILE (or '-' for standard input); exit 2 with a clear message if it is malformed."""
    text = read_text(path)
    from fusecut.sources import parse_any

    try:
        return parse_any(text)
    except FusecutError as e:
        fail(str(e))


def fail(message: str, code: int = 2):
    err.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    raise typer.Exit(code)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=1) + "\n")


@contextmanager
def progress(what: str) -> Iterator[Callable[[str], None]]:
    """On a terminal, a spinner and the time spent on standard error while the block runs;
    yields a function that changes its text. Elsewhere nothing is shown."""
    if not err.is_terminal:
        yield lambda text: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(what)
        yield lambda text: bar.update(task, description=text)


def _shape(bound: Bound | None, name: str) -> list[int] | None:
    return list(bound.shapes[name]) if bound is not None and name in bound.shapes else None


@app.command(short_help="Parse a definition: its inputs, ops and outputs.")
def check(file: str = FILE,
          inputs: str = INPUTS, as_json: bool = AS_JSON):
    """Parse a definition; print its inputs, ops and outputs with shapes and dtypes.

    FILE is an nvFuser repro, a wire-JSON definition or a POST /v1/plan body ('-' reads
    standard input)."""
    from fusecut.optimizer.analysis.shapes import bind

    with progress(f"reading {file}") as say:
        parsed = read_definition(file)
        fusion = parsed.fusion
        metas = input_metadata(parsed, inputs, required=False)
        bound = None
        if metas is not None:
            say(f"binding the inputs to {counted(len(fusion.ops), 'op')}")
            try:
                bound = bind(fusion, metas)
            except FusecutError as e:
                fail(str(e))
    rows_in = []
    for name in fusion.inputs:
        if name in fusion.tensors:
            t = fusion.tensors[name]
            meta = bound.inputs[name] if bound else None
            rows_in.append({"name": name, "dtype": t.dtype.value,
                            "declared": list(t.declared_shape or ()),
                            "shape": _shape(bound, name),
                            "strides": list(meta.strides) if meta else None})
        else:
            rows_in.append({"name": name, "dtype": fusion.scalars[name].dtype.value,
                            "declared": "scalar", "shape": [], "strides": None})
    rows_ops = [{"index": i, "op": op.name, "inputs": list(op.inputs),
                 "outputs": list(op.outputs),
                 "dtypes": [fusion.value_dtype(o).value for o in op.outputs],
                 "shapes": [_shape(bound, o) for o in op.outputs]}
                for i, op in enumerate(fusion.ops)]
    rows_out = [{"name": name, "dtype": fusion.value_dtype(name).value,
                 "shape": _shape(bound, name)} for name in fusion.outputs]
    if as_json:
        emit_json({"function": parsed.function_name, "inputs": rows_in, "ops": rows_ops,
                   "outputs": rows_out})
        return
    print_definition(out, rows_in, rows_ops, rows_out)


def input_metadata(parsed: ParsedDefinition, inputs: str | None,
                   required: bool = True) -> list[InputMeta] | None:
    """Input metadata from --inputs (JSON text or @file) or the definition's own (a repro's
    ``inputs = [...]`` list, a plan request's "inputs")."""
    from fusecut.sources import parse_inputs

    if inputs is None:
        if parsed.inputs is None and required:
            fail("no input metadata: the definition has no inputs list; pass --inputs "
                 "'[{\"shape\": [...], \"dtype\": \"float32\"}, ...]'")
        return parsed.inputs
    text = read_text(inputs[1:], f"--inputs {inputs[1:]}") if inputs.startswith("@") \
        else inputs
    try:
        return parse_inputs(text)
    except FusecutError as e:
        fail(str(e))


def plan_option(option: Option, flag: str, metavar: str) -> Any:
    """A command-line option for a plan option: its default, help and check are the
    declaration's (``optimizer.options``); a bad value is refused before anything is read,
    naming the flag, what it takes and what was given."""

    def check(value: Any) -> Any:
        try:
            return checked(option, value)
        except FusecutError as e:
            raise typer.BadParameter(str(e)) from None

    described = option.description if option.range is None else \
        f"{option.description}, in {option.range}"
    return typer.Option(option.default, flag, metavar=metavar,
                        help=described, callback=check)


@app.command(short_help="Plan a fusion: segments and bytes against greedy.")
def plan(file: str = FILE,
         segmenter: str = plan_option(SEGMENTER, "--segmenter", "NAME"),
         time_limit: float = plan_option(TIME_LIMIT_S, "--time-limit", "SECONDS"),
         device: str = plan_option(DEVICE, "--device", "NAME"),
         inputs: str = INPUTS,
         as_json: bool = typer.Option(False, "--json", help="print the Plan JSON alone"),
         num_streams: int = plan_option(NUM_STREAMS, "--num-streams", "N"),
         svg: Path = typer.Option(None, "--svg", metavar="PATH",
                                  help="write a picture of the segments"),
         dot: Path = typer.Option(None, "--dot", metavar="PATH",
                                  help="write the segment graph as Graphviz DOT")):
    """Plan a fusion: segments, boundary tensors and bytes against greedy and the lower bound.

    FILE is an nvFuser repro, a wire-JSON definition or a POST /v1/plan body ('-' reads
    standard input); without an inputs list in it, give --inputs."""
    from fusecut.engine import default_engine

    parsed = read_definition(file)
    metas = input_metadata(parsed, inputs)
    try:
        with progress(f"planning {counted(len(parsed.fusion.ops), 'op')} with {segmenter} "
                      f"(time limit {time_limit:g} s)"):
            result = default_engine().fusion(parsed.fusion).plan(
                metas, segmenter=segmenter, time_limit_s=time_limit, device=device,
                num_streams=num_streams).to_json()
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
        emit_json(result)
        return
    print_plan(out, result)


@app.command(short_help="Write the CUDA source of every segment.")
def codegen(file: str = FILE,
            out_dir: Path = typer.Option(..., "--out", metavar="DIR",
                                         help="directory for the .cu files"),
            inputs: str = INPUTS,
            compile_check: bool = typer.Option(False, "--compile", help="compile with NVRTC"),
            arch: str = typer.Option("sm_90", "--arch", metavar="ARCH",
                                     help="architecture for --compile"),
            as_json: bool = AS_JSON):
    """Write the CUDA source of every generated segment, with its launch parameters.

    FILE is an nvFuser repro, a wire-JSON definition or a POST /v1/plan body ('-' reads
    standard input)."""
    from fusecut.codegen import generate_segment
    from fusecut.engine import default_engine

    parsed = read_definition(file)
    try:
        with progress(f"planning {counted(len(parsed.fusion.ops), 'op')}"):
            plan_ = default_engine().fusion(parsed.fusion).plan(input_metadata(parsed, inputs))
    except FusecutError as e:
        fail(str(e))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"cannot make {out_dir}: {e.strerror}")
    written = []
    with progress("generating kernels") as say:
        for seg in plan_.segments:
            say(f"generating segment {seg.index} of {len(plan_.segments)} ({seg.kind.value})")
            sk = generate_segment(plan_, seg)
            if not sk.kernels:
                written.append({"segment": seg.index, "kind": seg.kind.value, "file": None,
                                "runs": "torch (library or fallback)", "kernels": []})
                continue
            path = out_dir / f"segment{seg.index}_{seg.kind.value}.cu"
            path.write_text(sk.source)
            launch = {"segment": seg.index, "kind": seg.kind.value, "file": str(path),
                      "notes": sk.notes,
                      "workspaces": [{"name": w.name, "bytes": w.nbytes} for w in sk.workspaces],
                      "kernels": [{"name": k.name, "grid": k.grid, "block": k.block,
                                   "shared_memory": k.smem,
                                   "params": [{"kind": p.kind, "name": p.name, "type": p.ctype,
                                               **({"value": p.value} if p.kind == "extent"
                                                  else {})}
                                              for p in k.params]} for k in sk.kernels]}
            path.with_suffix(".json").write_text(json.dumps(
                {k: v for k, v in launch.items() if k != "file"}, indent=1) + "\n")
            if compile_check:
                from fusecut.runtime.compile import compile_cubin

                say(f"compiling segment {seg.index} with NVRTC for {arch}")
                try:
                    launch["cubin_bytes"] = len(compile_cubin(sk.source, arch,
                                                              sk.kernels[0].name))
                except Exception as e:  # NVRTC's log, or no NVRTC: one line, not a traceback
                    fail(f"segment {seg.index} ({path}) did not compile for {arch}: "
                         f"{' '.join(str(e).split())[:2000]}")
            written.append(launch)
    compiled = None
    if compile_check:
        from fusecut.runtime.compile import cache_dir

        # the cubins are not written beside the sources: they go to the kernel cache
        compiled = {"arch": arch, "segments": sum("cubin_bytes" in w for w in written),
                    "cubin_cache": str(cache_dir())}
    if as_json:
        emit_json({"out": str(out_dir), "segments": written,
                   **({"compiled": compiled} if compiled else {})})
        return
    table = Table(title=f"generated kernels in {out_dir}")
    for col in ("segment", "kind", "file", "kernels", "grid x block"):
        table.add_column(col)
    for w in written:
        table.add_row(str(w["segment"]), w["kind"],
                      Path(w["file"]).name if w["file"] else "(torch: library or fallback)",
                      ", ".join(k["name"] for k in w["kernels"]),
                      "; ".join(f"{k['grid']} x {k['block']}" for k in w["kernels"]))
    out.print(table)
    if compiled:
        err.print(f"compiled {counted(compiled['segments'], 'segment')} with NVRTC for "
                  f"{arch}: the cubins are in the kernel cache, {compiled['cubin_cache']} "
                  f"(FUSECUT_CACHE_DIR), not in {out_dir}", soft_wrap=True)


@app.command(short_help="Run a definition; print per-segment times.")
def execute(file: str = FILE,
            device: str = typer.Option(None, "--device", metavar="DEVICE",
                                       help="cuda, cuda:N or cpu (default: cuda if available)"),
            scale: int = typer.Option(None, "--scale", metavar="N",
                                      help=f"shrink the inputs to at most N elements each; 0: "
                                           f"full size (default: full size on a GPU, "
                                           f"{CPU_ELEMENTS} on the CPU)"),
            inputs: str = INPUTS,
            check: bool = typer.Option(True, "--check/--no-check",
                                       help="compare with the torch reference"),
            as_json: bool = AS_JSON):
    """Run a definition on random inputs made like its input metadata; print per-segment times.

    FILE is an nvFuser repro with an inputs list, or a POST /v1/plan body with "inputs" ('-'
    reads standard input); or give --inputs."""
    parsed = read_definition(file)
    metas = input_metadata(parsed, inputs)
    device, kind = _execution_device(device)
    metas, scaled = _execution_inputs(parsed, metas, kind, scale)
    result, want = _execute_checked(parsed.fusion, metas, device, check)
    worst = None
    if check:
        worst = max((float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
                     for a, b in zip(result.outputs, want)), default=0.0)
    segments = [{"index": t.index, "kind": t.kind, "seconds": t.seconds, "bytes": t.bytes,
                 "bytes_per_second": t.bytes / t.seconds if t.seconds > 0 else None}
                for t in result.timings]
    if as_json:
        emit_json({"device": device, "backend": result.backend, "scaled": scaled,
                   "segments": segments,
                   "outputs": [{"name": n, "shape": list(v.shape), "dtype": str(v.dtype)}
                               for n, v in zip(parsed.fusion.outputs, result.outputs)],
                   "max_difference": worst})
        return
    print_execution(out, parsed.fusion.outputs, device, result, segments, worst)


def _execution_device(device: str | None) -> tuple[str, str]:
    """The device ``execute`` runs on (--device, else cuda when there is one, else cpu) and its
    type; exit 2 for one that is no device, not cuda or cpu, or a GPU that is not here."""
    import torch

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
    return device, kind


def _execution_inputs(parsed: ParsedDefinition, metas: list[InputMeta], kind: str,
                      scale: int | None) -> tuple[list[InputMeta], dict | None]:
    """The input metadata ``execute`` runs, shrunk to at most --scale elements each (by
    default, on the CPU only: CPU_ELEMENTS), and what the scaling did, for the JSON (None:
    nothing shrunk); a note on standard error says so."""
    from fusecut.optimizer.analysis.shapes import shrink_inputs
    from fusecut.optimizer.ir.inputs import TensorMeta

    limit = (CPU_ELEMENTS if kind == "cpu" else 0) if scale is None else scale
    largest = max((m.numel for m in metas if isinstance(m, TensorMeta)), default=0)
    if not limit or largest <= limit:
        return metas, None
    # only the extents the definition leaves free shrink (issue 32: a definition with
    # constant sizes failed, scaled, on an op; 7 of the 28 corpus files did)
    shrunk = shrink_inputs(parsed.fusion, metas, limit)
    metas = shrunk.metas
    run = max((m.numel for m in metas if isinstance(m, TensorMeta)), default=0)
    scaled = {"max_elements": limit, "largest_given": largest, "largest_run": run,
              "kept_extents": sorted(shrunk.kept)}
    why = ""
    if shrunk.kept:
        extents = sorted(shrunk.kept)
        first = shrunk.kept[extents[0]]
        which = "extents {}, which keep their size" if len(extents) > 1 else \
            "extent {}, which keeps its size"
        why = (f"; the definition fixes {which.format(', '.join(map(str, extents)))} "
               f"(shrinking {extents[0]}: {first})")
    if run < largest:
        err.print(f"note: inputs scaled down to at most {limit:,} elements each (the "
                  f"largest has {largest:,}, {run:,} as run)"
                  + (" to keep a CPU run short" if scale is None else "") + why
                  + "; --scale 0 runs them full size", soft_wrap=True)
    else:
        err.print(f"note: inputs run at full size, {largest:,} elements in the largest "
                  f"(on the CPU, seconds to minutes){why}", soft_wrap=True)
    return metas, scaled


def _execute_checked(fusion, metas: list[InputMeta], device: str, check: bool
                     ) -> tuple[Any, list | None]:
    """The timed run on random inputs and, with --check, the torch reference's outputs on the
    same inputs; a FusecutError exits 2, a RuntimeError (torch's or the CUDA driver's) exits 1
    with its first line."""
    from fusecut.runtime.reference import run_reference

    want = None
    try:
        with progress("planning") as say:
            args, result = plan_and_run(fusion, metas, device, say)
            if check:
                say("checking against the torch reference")
                want = run_reference(fusion, args)
    except FusecutError as e:
        fail(str(e))
    except RuntimeError as e:  # from torch or the CUDA driver: its first line says what
        fail(f"execution on {device} failed: {str(e).strip().splitlines()[0]}", 1)
    return result, want


def plan_and_run(fusion, metas: list[InputMeta], device: str, say: Callable[[str], None]
                 ) -> tuple[list, Any]:
    """Plan ``fusion`` for ``metas``, make random inputs like them on ``device`` and run the
    plan, timed per segment: the arguments and the run's result. Through the process's engine,
    as every door goes (a plan made here is the SDK's, and the other way)."""
    from fusecut.engine import default_engine
    from fusecut.runtime.tensors import make_input

    handle = default_engine().fusion(fusion)
    plan_ = handle.plan(metas)
    say("making inputs")
    args = [make_input(m, device) for m in metas]
    say(f"running {len(plan_.segments)} segment(s) on {device}")
    return args, handle.engine.run(plan_, args, timed=True)


# uvicorn's log levels (its own check would end in a traceback)
LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]


def _log_level(value: str) -> str:
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.lower()


@app.command(short_help="Run the HTTP service.")
def serve(host: str = typer.Option("127.0.0.1", "--host", metavar="HOST",
                                   help="address to bind (loopback by default)"),
          port: int = typer.Option(8000, "--port", metavar="PORT", min=1, max=65535,
                                   help="TCP port (1-65535)"),
          workers: int = typer.Option(1, "--workers", metavar="N", help="uvicorn worker processes"),
          db: str = typer.Option(None, "--db", metavar="PATH",
                                 help="the plan cache, an SQLite file (default: "
                                      "FUSECUT_DB_PATH, else plans.sqlite in a folder per "
                                      "version and checkout under ~/.local/share/fusecut)"),
          cache: str = typer.Option(None, "--cache", metavar="URL",
                                    help="plan cache: an SQLite path, or postgresql://... to "
                                         "share one with other replicas (overrides --db; "
                                         "default: FUSECUT_CACHE_URL)"),
          gpus: str = typer.Option(None, "--gpus", metavar="all|0,1,...",
                                   help="GPU workers per listed device: all, or indices as 0,1 "
                                        "(default: FUSECUT_GPUS, else workers on whatever "
                                        "devices are visible)"),
          api_key: str = typer.Option(None, "--api-key", metavar="KEY",
                                      help="require 'Authorization: Bearer KEY' on every /v1 "
                                           "route and /dashboard (default: FUSECUT_API_KEY)"),
          ssl_certfile: Path = typer.Option(None, "--ssl-certfile", metavar="PATH",
                                            help="serve HTTPS with this certificate (PEM)"),
          ssl_keyfile: Path = typer.Option(None, "--ssl-keyfile", metavar="PATH",
                                           help="the certificate's private key (PEM)"),
          log_level: str = typer.Option("info", "--log-level", metavar="LEVEL",
                                        callback=lambda v: _log_level(v),
                                        help="uvicorn log level: " + ", ".join(LOG_LEVELS)),
          access_log: bool = typer.Option(False, "--access-log/--no-access-log",
                                          help="log every request (metrics count them "
                                               "either way)")):
    """Run the HTTP service (settings from FUSECUT_* environment variables and these options)."""
    import tempfile

    import uvicorn

    from fusecut import environment
    from fusecut.service.settings import Settings

    if api_key is not None and not api_key.strip():
        # --api-key "$KEY" with KEY unset would otherwise serve with no authentication (an empty
        # FUSECUT_API_KEY stays "unset": compose passes ${FUSECUT_API_KEY:-})
        raise typer.BadParameter("the API key is empty: give a key, or leave --api-key (and "
                                 "FUSECUT_API_KEY) out to serve without one",
                                 param_hint="'--api-key'")
    # Settings reach every uvicorn worker process through the environment.
    for name, value in (("FUSECUT_DB_PATH", db), ("FUSECUT_API_KEY", api_key),
                        ("FUSECUT_CACHE_URL", cache), ("FUSECUT_GPUS", gpus)):
        if value is not None:
            environment.export(name, value)
    for line in environment.unknown():  # a misspelt setting: said before anything else
        err.print(f"warning: {line}", soft_wrap=True)
    try:  # every variable checked here, in one line naming it, not in every worker
        from fusecut.service.processes.worker_pool import parse_gpus

        environment.check()
        parse_gpus(Settings.from_env().gpus, name="--gpus" if gpus is not None else
                   "FUSECUT_GPUS")
    except ValueError as e:
        fail(str(e))
    if (ssl_certfile is None) != (ssl_keyfile is None):
        fail("HTTPS needs both --ssl-certfile and --ssl-keyfile")
    for path in (ssl_certfile, ssl_keyfile):
        if path is not None and not path.is_file():
            fail(f"cannot read {path}")
    settings = Settings.from_env()
    if host not in ("127.0.0.1", "localhost", "::1") and not settings.allowed_hosts:
        err.print(f"note: the service answers requests that name it localhost, 127.0.0.1 or "
                  f"[::1] only; set FUSECUT_ALLOWED_HOSTS to the names clients reach "
                  f"{host} by (or '*')", soft_wrap=True)
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each process writes its samples here; /metrics adds them up.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="fusecut-metrics-")
    uvicorn.run("fusecut.service.app:create_app", factory=True, host=host, port=port,
                workers=workers, log_level=log_level, access_log=access_log,
                http="fusecut.service.http:ReadTimeoutProtocol",  # deadlines and caps
                ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
                ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None)


@app.command("ray-serve", short_help="Run the HTTP service on Ray Serve.")
def ray_serve(address: str = typer.Option(None, "--address", metavar="ADDRESS",
                                          help="a running Ray cluster (auto, or HOST:PORT); "
                                               "default: start one here"),
              host: str = typer.Option("127.0.0.1", "--host", metavar="HOST",
                                       help="address Serve's HTTP proxy binds"),
              port: int = typer.Option(8000, "--port", metavar="PORT", min=1, max=65535,
                                       help="Serve's HTTP port (1-65535)"),
              cache: str = typer.Option(None, "--cache", metavar="URL",
                                        help="plan cache shared by the replicas: "
                                             "postgresql://... (or an SQLite path on one node; "
                                             "default: FUSECUT_CACHE_URL)"),
              plan_replicas: int = typer.Option(2, "--plan-replicas", metavar="N",
                                                help="planning replicas (CPU)"),
              min_replicas: int = typer.Option(None, "--min-replicas", metavar="N",
                                               help="autoscale planning replicas from this "
                                                    "many..."),
              max_replicas: int = typer.Option(None, "--max-replicas", metavar="N",
                                               help="...to this many"),
              plan_cpus: float = typer.Option(1.0, "--plan-cpus", metavar="CPUS",
                                              help="CPUs Ray reserves per planning replica"),
              execute_replicas: int = typer.Option(1, "--execute-replicas", metavar="N",
                                                   help="execute replicas"),
              execute_gpus: float = typer.Option(None, "--execute-gpus", metavar="GPUS",
                                                 help="GPUs per execute replica (default: 1 if "
                                                      "the cluster has GPUs, else 0: the CPU "
                                                      "path)"),
              num_cpus: int = typer.Option(None, "--num-cpus", metavar="N",
                                           help="a local cluster's CPUs (default: all)"),
              object_store_mb: int = typer.Option(256, "--object-store-mb", metavar="MB",
                                                  help="a local cluster's object store")):
    """Serve the HTTP API on Ray Serve: planning replicas behind Serve's proxy, executions on
    GPU replicas, one shared plan cache (needs the 'ray' extra)."""
    try:
        from fusecut.service import ray_serve as rs
    except ImportError as e:
        fail(f"ray-serve needs Ray Serve: pip install 'fusecut[ray]' ({e})")
    from fusecut import environment
    from fusecut.service.settings import Settings

    if cache is not None:
        environment.export("FUSECUT_CACHE_URL", cache)

    try:  # every variable checked before Ray starts, in one line naming it
        environment.check()
        Settings.from_env()
    except ValueError as e:
        fail(str(e))

    def ready(url: str, gpus: float) -> None:
        err.print(f"fusecut on Ray Serve at {url} ({plan_replicas} planning replicas, "
                  f"{execute_replicas} execute replicas with {gpus:g} GPU each)")

    rs.run(address, host, port, plan_replicas, min_replicas, max_replicas, plan_cpus,
           execute_replicas, execute_gpus, num_cpus, object_store_mb, ready)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
