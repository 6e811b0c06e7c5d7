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

Host side only, on any machine with NVRTC (no GPU is needed to compile). The step times against
nvFuser and torch.compile with ``mark_dynamic`` need the GPU: not in this script yet.

    python -m benchmarks.shapes [--seed 0] [--cases softmax,layernorm_fwd,...]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0, help="the shapes' order")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated")
    args = parser.parse_args()
    shapes = [(b, s) for b in BATCHES for s in SEQUENCES]
    random.Random(args.seed).shuffle(shapes)
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
