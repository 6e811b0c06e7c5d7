"""What a new batch or sequence length costs on the host (issue 44): plans searched, plans
rebound, NVRTC compiles, and milliseconds per new shape, over 16 batch x sequence shapes in
random order on corpus fusions.

Each case starts with an empty engine and empty kernel caches (memory and disk), then meets the
16 shapes one after another as a training loop with varying lengths would: per shape the plan a
run uses (``FusionHandle.execution_plan``: searched once per range of shapes, rebound to the
others), each segment's kernels generated and compiled (NVRTC's cache is keyed by the source,
and the kernels take the rows at launch). The first shape pays the search and the compiles; the
table gives it apart. What each new shape cost before kernels took their extents at launch is
about the first shape's cost: its own search and its own NVRTC compile per kernel.

Host side only by default, on any machine with NVRTC (no GPU is needed to compile). With
``--gpu`` (on the device) it also runs every shape, in the same order, through four systems in
one process, and per shape measures the first call (what a new shape costs the user, host and
GPU, synchronized) and the warm call's GPU time (CUDA events, rotating rounds):

- ``fusecut``: ``FusionHandle.execute`` as ``fd.execute`` runs it: the range's plan, rebound;
- ``own plan``: the plan searched for exactly this shape, compiled for it (what fusecut ran
  before plans held for a range): the range plan's cost is the ratio of the two;
- ``nvFuser``: the real nvFuser (``source .nvf/setup.sh``), one definition for every shape;
- ``torch.compile``: the case's eager function compiled with ``dynamic=True`` (as
  ``mark_dynamic`` on every axis).

    python -m benchmarks.shapes [--seed 0] [--cases softmax,layernorm_fwd,...] [--gpu]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import markdown_table, write_result
from fusecut.codegen import generate_segment
from fusecut.engine import Engine
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.runtime import compile as nvrtc

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"


def corpus(name: str) -> str:
    return (CORPUS / f"{name}.py").read_text()


BATCHES = (1, 2, 4, 8)
SEQUENCES = (512, 1000, 1536, 2048)
B, F, I64 = DType.bfloat16, DType.float32, DType.int64
# name -> (definition, the inputs at batch x sequence); the 2-D cases take batch x sequence rows
CASES = {
    "softmax_fwd": (corpus("softmax_fwd"), lambda b, s: [((b * s, 4096), B)]),
    "layernorm_fwd": (corpus("layernorm_fwd"),
                      lambda b, s: [((b * s, 4096), B), ((4096,), B), ((4096,), B)]),
    "layernorm_bwd": (corpus("layernorm_bwd"),
                      lambda b, s: [((b * s, 4096), B), ((b * s, 4096), B), ((b * s, 1), F),
                                    ((b * s, 1), F), ((4096,), B)]),
    "silu_mul_fwd": (corpus("silu_mul_fwd"), lambda b, s: [((b * s, 14336), B)] * 2),
    "gelu_tanh_fwd": (corpus("gelu_tanh_fwd"),
                      lambda b, s: [((b * s, 16384), B), ((16384,), B)]),
    "cross_entropy_fwd": (corpus("cross_entropy_fwd"),
                          lambda b, s: [((b * s, 32000), B), ((b * s,), I64)]),
    # Llama's RMSNorm backward as Thunder hands it over: [batch, sequence, 2048]
    "rmsnorm_bwd_thunder": (
        corpus("rmsnorm_bwd_thunder").replace("[8, 2048, 2048]", "T0.shape()")
        .replace("[8, 2048, 1]", "T4.shape()"),
        lambda b, s: [((b, s, 2048), B), ((b, s, 2048), B), ((2048,), B), ((b, s, 2048), B),
                      ((b, s, 1), F), ((b, s, 2048), B)]),
}


def fresh_caches() -> None:
    """Empty caches: NVRTC's in memory, and a new directory for the kernels and plans on disk."""
    nvrtc.clear_memory_cache()
    os.environ["FUSECUT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fusecut-shapes-")


def host_name() -> str:
    """This machine's CPU, as the results file names the device."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def run_case(name: str, shapes: list[tuple[int, int]]) -> dict:
    text, inputs = CASES[name]
    fusion = parse_text(text).fusion
    fresh_caches()
    engine = Engine()
    handle = engine.fusion(fusion)
    costs = []
    for batch, seq in shapes:
        metas = [tensor_meta(shape, dtype) for shape, dtype in inputs(batch, seq)]
        compiles = nvrtc.STATS.compiles
        start = time.perf_counter()
        plan = handle.execution_plan(metas)
        planned = time.perf_counter()
        generated = [generate_segment(plan, s) for s in plan.segments]
        coded = time.perf_counter()
        for kernels in generated:
            if kernels.kernels:
                nvrtc.compile_cubin(kernels.source, "sm_90", kernels.kernels[0].name)
        done = time.perf_counter()
        costs.append({"plan": planned - start, "codegen": coded - planned,
                      "compile": done - coded, "total": done - start,
                      "compiles": nvrtc.STATS.compiles - compiles})
    later = costs[1:]
    return {"case": name, "shapes": len(shapes), "searched": engine.stats.plans_made,
            "rebound": engine.stats.plans_rebound,
            "compiles": sum(c["compiles"] for c in costs),
            "first_ms": costs[0]["total"] * 1e3,
            "first_compile_ms": costs[0]["compile"] * 1e3,
            "median_ms": statistics.median(c["total"] for c in later) * 1e3,
            "max_ms": max(c["total"] for c in later) * 1e3,
            "plan_ms": statistics.median(c["plan"] for c in later) * 1e3,
            "codegen_ms": statistics.median(c["codegen"] for c in later) * 1e3,
            "lookup_ms": statistics.median(c["compile"] for c in later) * 1e3}


# ---- on the GPU: each shape's warm call against its own plan, nvFuser and torch.compile -------

def gpu_case(name: str, shapes: list[tuple[int, int]], nvfuser, iters: int) -> list[dict]:
    """One row per shape: the first call's seconds and the warm call's GPU seconds per system
    (or why a system did not run)."""
    import torch

    import fusecut
    from benchmarks.kernels import eager_function, medians_in_rounds
    from benchmarks.nvfuser_peer import describe
    from fusecut.engine import default_engine
    from fusecut.runtime.program import baked_positions, signature
    from fusecut.runtime.run import compile_plan
    from fusecut.runtime.tensors import make_input

    text, inputs = CASES[name]
    fusion = parse_text(text).fusion
    fresh_caches()
    default_engine().clear()
    fd = fusecut.FusionDefinition.from_fusion(fusion)  # the user's door, on the default engine
    handle = default_engine().fusion(fusion)
    nvf, why_not = None, {}
    if nvfuser is not None:
        try:
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(text)
            nvf, _ = nvfuser.define(Path(f.name))
        except Exception as exc:
            why_not["nvFuser"] = describe(exc)
    compiled = None
    rows = []
    for batch, seq in shapes:
        metas = [tensor_meta(shape, dtype) for shape, dtype in inputs(batch, seq)]
        torch.manual_seed(batch * 10007 + seq)
        args = [make_input(m, "cuda") for m in metas]
        if compiled is None:
            eager = eager_function(name, fusion, args)
            compiled = torch.compile(eager, dynamic=True)
        # first calls: what a new shape costs each system
        systems = {"fusecut": lambda a=args: fd.execute(a)}
        if nvf is not None:
            systems["nvFuser"] = lambda a=args: nvf.execute(a)
        systems["torch.compile"] = lambda a=args, f=compiled: f(*a)
        row = {"shape": f"{batch}x{seq}", "first": {}, "warm": {}, "error": dict(why_not)}
        for system, call in list(systems.items()):
            start = time.perf_counter()
            try:
                call()
                torch.cuda.synchronize()
                row["first"][system] = time.perf_counter() - start
            except Exception as exc:
                row["error"][system] = describe(exc)
                del systems[system]
        if "fusecut" in systems:  # the programs themselves: the range's plan and this shape's
            program = handle.program(args)
            own = compile_plan(handle.plan(metas), args, signature(args, baked_positions(fusion)))
            systems["range plan"] = lambda a=args, p=program: p.run(a)
            systems["own plan"] = lambda a=args, p=own: p.run(a)
        for system, seconds in zip(systems, medians_in_rounds(list(systems.values()), iters)):
            row["warm"][system] = seconds
        print(name, row["shape"], " ".join(f"{k} {v * 1e6:.1f}us" for k, v in row["warm"].items()),
              row["error"] or "", flush=True)
        rows.append(row)
    return rows


def gpu_tables(results: dict[str, list[dict]]) -> tuple[str, str]:
    """The summary per case and the detail per shape, as markdown."""
    def ratio(row, a, b):
        w = row["warm"]
        return w[a] / w[b] if a in w and b in w else None

    def geomean(values):
        values = [v for v in values if v is not None]
        return statistics.geometric_mean(values) if values else None

    def cell(value, fmt="{:.3f}"):
        return "n/a" if value is None else fmt.format(value)

    summary, detail = [], []
    for name, rows in results.items():
        own = [ratio(r, "range plan", "own plan") for r in rows]
        firsts = {s: statistics.median(r["first"][s] for r in rows[1:] if s in r["first"])
                  if any(s in r["first"] for r in rows[1:]) else None
                  for s in ("fusecut", "nvFuser", "torch.compile")}
        summary.append([name, len(rows), cell(geomean(own)),
                        cell(max((v for v in own if v is not None), default=None)),
                        cell(geomean([ratio(r, "nvFuser", "fusecut") for r in rows])),
                        cell(geomean([ratio(r, "torch.compile", "fusecut") for r in rows])),
                        " / ".join(cell(firsts[s] and firsts[s] * 1e3, "{:.2f}")
                                   for s in firsts),
                        " / ".join(cell(sum(r["first"][s] for r in rows if s in r["first"])
                                        if any(s in r["first"] for r in rows) else None,
                                        "{:.2f}") for s in firsts)])
        for r in rows:
            w = r["warm"]
            detail.append([name, r["shape"]] + [cell(w.get(s) and w[s] * 1e6, "{:.1f}") for s in
                          ("fusecut", "range plan", "own plan", "nvFuser", "torch.compile")]
                          + [cell(r["first"].get(s) and r["first"][s] * 1e3, "{:.1f}")
                             for s in ("fusecut", "nvFuser", "torch.compile")]
                          + ["; ".join(f"{k}: {v}" for k, v in r["error"].items())])
    return (markdown_table(["case", "shapes", "range plan / own plan (geomean)",
                            "range plan / own plan (worst)", "nvFuser / fusecut (geomean)",
                            "torch.compile / fusecut (geomean)",
                            "new shape's first call ms, median: fusecut / nvFuser / "
                            "torch.compile",
                            "every first call, s in all: fusecut / nvFuser / torch.compile"],
                           summary),
            markdown_table(["case", "shape", "fusecut us", "range plan us", "own plan us",
                            "nvFuser us", "torch.compile us", "fusecut first ms",
                            "nvFuser first ms", "torch.compile first ms", "notes"], detail))


def run_gpu(names: list[str], shapes: list[tuple[int, int]], iters: int, seed: int) -> None:
    import torch

    from benchmarks.nvfuser_peer import load_nvfuser
    from fusecut.runtime import launcher

    launcher.native(wait=True)  # warm calls are timed on the path users get once it is built
    peer, why = load_nvfuser()
    results = {name: gpu_case(name, shapes, peer, iters) for name in names}
    summary, detail = gpu_tables(results)
    order = ", ".join(f"{b}x{s}" for b, s in shapes)
    notes = (f"Shapes in this order (seed {seed}): {order}; each case starts from empty caches "
             "and meets them one after another in one process. Warm call: median CUDA-event "
             f"time over {iters} calls in rotating rounds. fusecut: `FusionHandle.execute` (the "
             "range's plan, rebound to the shape); own plan: the plan searched for exactly "
             "this shape. First call: a new shape's synchronized first call (fusecut: rebind, "
             "codegen, kernel cache; nvFuser: its own per-shape work; torch.compile "
             "dynamic=True: a recompile where a guard fails). The first shape is left out of "
             "the first-call medians. "
             + (f"nvFuser {peer.version}." if peer else f"nvFuser absent: {why}.")
             + "\n\n## Per shape\n\n" + detail)
    print(summary)
    print(detail)
    path = write_result("shapes", torch.cuda.get_device_name(), "Every shape: fusecut's range "
                        "plan against its own plan, nvFuser and torch.compile", summary, notes)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the shapes' order")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated")
    parser.add_argument("--gpu", action="store_true",
                        help="run every shape on the GPU against nvFuser and torch.compile")
    parser.add_argument("--iters", type=int, default=30, help="warm calls per system and shape")
    args = parser.parse_args()
    shapes = [(b, s) for b in BATCHES for s in SEQUENCES]
    random.Random(args.seed).shuffle(shapes)
    if args.gpu:
        run_gpu(args.cases.split(","), shapes, args.iters, args.seed)
        return
    rows = []
    for name in args.cases.split(","):
        r = run_case(name, shapes)
        rows.append([r["case"], r["shapes"], r["searched"], r["rebound"], r["compiles"],
                     f"{r['first_ms']:.0f} ({r['first_compile_ms']:.0f} NVRTC)",
                     f"{r['median_ms']:.2f} / {r['max_ms']:.2f}",
                     f"{r['plan_ms']:.2f} / {r['codegen_ms']:.2f} / {r['lookup_ms']:.3f}"])
        print(" | ".join(map(str, rows[-1])), flush=True)
    table = markdown_table(
        ["case", "shapes", "plans searched", "plans rebound", "NVRTC compiles",
         "first shape ms", "each new shape ms (median / max)",
         "of which plan / codegen / compile lookup ms (median)"], rows)
    order = ", ".join(f"{b}x{s}" for b, s in shapes)
    notes = (f"Batch x sequence shapes in this order (seed {args.seed}): {order}; rows = batch x "
             "sequence. Host side only (NVRTC for sm_90, no GPU): plan, codegen and the "
             "kernel cache per new shape. Before kernels took their extents at launch, each new "
             "shape cost about what the first one does (its own search and NVRTC compile per "
             "kernel).")
    print(table)
    path = write_result("shapes", f"{host_name()}, host only", "A new shape's host cost", table,
                        notes)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
