"""Stream lowering benchmark: the same fusion run unsplit and as a host program on 1,
2, 4 and 8 CUDA streams, beside eager torch and torch.compile, in one process.

    python -m benchmarks.streams [--iters 40] [--cases seed_4147_stream_two_ops,...] [--no-compile]

Each time is the median CUDA-event time of a whole ``fd.execute`` call (Python included), taken
in rotating rounds. Overlap can help where one slice leaves the GPU idle: a matmul per slice too
small to fill the SMs, followed by pointwise work. Where each slice is already a full wave of
memory-bound work (the stream-lowering issue's own cases), streams can only add launch overhead;
those rows show its cost. The floor is the plan's lower-bound bytes over measured copy
bandwidth.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch

import fusecut
from benchmarks.common import CORPUS, markdown_table, write_result
from benchmarks.kernels import copy_bandwidth, medians_in_rounds
from fusecut.optimizer.ir import parse_text

STREAMS = (1, 2, 4, 8)

HEADER = "from nvfuser import FusionDefinition, DataType, ParallelType\ndef f(fd):\n"
LINEAR_SILU = """
X = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16)
W = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
Y = fd.ops.linear(X, W)
Y32 = fd.ops.cast(Y, dtype=DataType.Float)
G = fd.ops.sigmoid(Y32)
Z32 = fd.ops.mul(Y32, G)
Z = fd.ops.cast(Z32, dtype=DataType.BFloat16)
fd.add_output(Z)
fd.sched.parallelize(Y, 0, ParallelType.stream)
fd.sched.parallelize(Y32, 0, ParallelType.stream)
fd.sched.parallelize(G, 0, ParallelType.stream)
fd.sched.parallelize(Z32, 0, ParallelType.stream)
fd.sched.parallelize(Z, 0, ParallelType.stream)
"""


def linear_silu_eager(x, w):
    return torch.nn.functional.silu(torch.nn.functional.linear(x, w).float()).bfloat16()


def two_ops_eager(x):
    t1 = x + x
    return t1, t1.sum(1)


def set_eager(x):
    return x.clone()


def _definition(body: str):
    lines = "".join(f"    {line}\n" for line in body.strip().splitlines())
    return parse_text(HEADER + lines).fusion


def cases():
    """(name, fusion, inputs, eager function)."""
    bf16 = dict(dtype=torch.bfloat16, device="cuda")
    f32 = dict(dtype=torch.float32, device="cuda")
    yield ("linear+silu, 16 slices of 256x8192 @ 8192x4096 (bf16)", _definition(LINEAR_SILU),
           [torch.randn(16, 256, 8192, **bf16), torch.randn(4096, 8192, **bf16) / 90],
           linear_silu_eager)
    yield ("linear+silu, 8 slices of 1024x4096 @ 4096x4096 (bf16)", _definition(LINEAR_SILU),
           [torch.randn(8, 1024, 4096, **bf16), torch.randn(4096, 4096, **bf16) / 64],
           linear_silu_eager)
    for name, eager in (("seed_4147_stream_two_ops", two_ops_eager),
                        ("seed_4147_stream_set", set_eager)):
        parsed = parse_text((CORPUS / f"{name}.py").read_text())
        shapes = [m.shape for m in parsed.inputs]
        yield name, parsed.fusion, [torch.randn(s, **f32) for s in shapes], eager


def measure_fusecut(name, fusion, inputs, iters: int) -> tuple[dict, dict, int]:
    """Per system (unsplit, 1-8 streams): median seconds per call, and per graph replay; and the
    plan's lower-bound bytes."""
    flat = copy.deepcopy(fusion)
    flat.stream_axes = []
    unsplit = fusecut.FusionDefinition.from_fusion(flat)
    split = fusecut.FusionDefinition.from_fusion(fusion)
    systems = [("fusecut unsplit", lambda: unsplit.execute(inputs))]
    want = unsplit.execute(inputs)
    for n in STREAMS:
        got = split.execute(inputs, num_streams=n)
        for g, w in zip(got, want):
            assert torch.allclose(g.float(), w.float(), rtol=2e-2, atol=2e-2), (name, n)
        systems.append((f"{n} streams", lambda n=n: split.execute(inputs, num_streams=n)))
    calls = dict(zip((s for s, _ in systems),
                     medians_in_rounds([fn for _, fn in systems], iters)))
    graphs = [(s, graphed(fn)) for s, fn in systems]
    replays = dict(zip((s for s, g in graphs if g is not None),
                       medians_in_rounds([g for _, g in graphs if g is not None], iters)))
    return calls, replays, split.plan(inputs).json["totals"]["lower_bound_bytes"]


def measure_torch(name, inputs, eager, iters: int, compile_: bool = True) -> dict:
    systems = [("eager", lambda: eager(*inputs))]
    try:
        if not compile_:
            raise RuntimeError("left out (--no-compile)")
        compiled = torch.compile(eager)
        compiled(*inputs)
        systems.append(("torch.compile", lambda: compiled(*inputs)))
    except Exception as exc:  # noqa: BLE001 - a missing compiler only loses its column
        print(f"torch.compile failed on {name}: {exc}", file=sys.stderr)
    return dict(zip((s for s, _ in systems), medians_in_rounds([fn for _, fn in systems], iters)))


def row_for(name, calls: dict, replays: dict, floor: float) -> list[str]:
    row = [name, f"{floor * 1e6:.0f}"]
    for column in COLUMNS[2:]:
        t, k = calls.get(column), replays.get(column)
        cell = f"{t * 1e6:.0f}" if t is not None else "n/a"
        row.append(cell + (f" ({k * 1e6:.0f})" if k is not None else ""))
    best = min(STREAMS, key=lambda n: calls[f"{n} streams"])
    row.append(f"{calls['fusecut unsplit'] / calls[f'{best} streams']:.2f}x at {best}")
    return row


def graphed(fn):
    """``fn`` captured in a CUDA graph (its kernels and stream waits without the Python that
    launches them): the replay, or None when it does not capture."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay
    except Exception as exc:  # noqa: BLE001 - a system that does not capture loses its column
        print(f"capture failed: {exc}", file=sys.stderr)
        return None


COLUMNS = ["case", "floor (us)", "eager", "torch.compile", "fusecut unsplit",
           *(f"{n} streams" for n in STREAMS)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    args = parser.parse_args(argv)
    chosen = set(filter(None, args.cases.split(",")))
    from fusecut.runtime import launcher

    launcher.native(wait=True)  # warm calls are timed on the path users get once it is built
    print(f"native launcher: {'built' if launcher.native() else launcher.failure()}", flush=True)
    device = torch.cuda.get_device_name()
    bandwidth = copy_bandwidth()
    measured = [(name, inputs, eager, *measure_fusecut(name, fusion, inputs, args.iters))
                for name, fusion, inputs, eager in cases() if not chosen or name in chosen]
    # torch.compile after every fusecut measurement: once dynamo has run, Python-heavy callers
    # in the same process run slower, which would charge fusecut's host loop for torch.compile
    rows = []
    for name, inputs, eager, calls, replays, lower_bound in measured:
        calls.update(measure_torch(name, inputs, eager, args.iters, not args.no_compile))
        rows.append(row_for(name, calls, replays, lower_bound / bandwidth))
        print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(COLUMNS + ["best streams vs unsplit"], rows)
    notes = (f"Median microseconds per `fd.execute` call (Python included), CUDA events, "
             f"{args.iters} calls in rotating rounds; in parentheses the same call captured in a "
             "CUDA graph and replayed (kernels, library calls and stream waits alone). Copy "
             f"bandwidth {bandwidth / 1e9:.0f} GB/s. Streams: the stream-lowered host program with "
             "`num_streams` = 1, 2, 4, 8; unsplit: the same fusion without its stream axes.")
    print(table)
    print(write_result("streams", device, "Stream lowering: host program on 1-8 streams",
                       table, notes))


if __name__ == "__main__":
    main()
