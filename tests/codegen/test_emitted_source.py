"""The generated CUDA of a few corpus fusions, pinned: a change meant to move code around in
codegen/ (not to change a kernel) must leave every byte of the source, and every launch
decision, as it was. A change that means to change kernels re-pins them:

    FUSECUT_REPIN_EMITTED=1 .venv/bin/python -m pytest -q tests/codegen/test_emitted_source.py

and the commit shows the new digests beside the kernels it changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fusecut.codegen import generate_segment
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from tests.conftest import CORPUS
from tests.helpers import fusion, small_metas

PINS = Path(__file__).parents[1] / "data" / "emitted_sources.json"
# one or more of each generated kind: pointwise, transpose, reduction, normalization,
# inner_outer, at a small size and at the repro's own (64-bit indexing, other launch shapes);
# rope_fwd_thunder: a cat of slices read a vector at a time (its sizes are fixed: both are its own)
CASES = ("gelu_tanh_fwd", "adam_step", "transpose_add", "seed_3334_reduction_broadcast_pointwise",
         "layernorm_fwd", "rmsnorm_fwd", "layernorm_bwd", "seed_2146_rmsnorm_bwd",
         "bias_dropout_add_layernorm", "group_norm_fwd", "rope_fwd_thunder")
GREEDY = PlanOptions(segmenter="greedy", time_limit_s=30)
# row sums: short rows (a warp per row), long rows split across blocks, and a pointwise kernel
# past 2**31 elements (64-bit indexing); sizes as metadata, nothing is allocated
ROW_SUM = ("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Half)\n"
           "T1 = fd.ops.sum(T0, dims=[1])\nT2 = fd.ops.exp(T1)\nfd.add_output(T2)")
BIG_POINTWISE = ("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
                 "dtype=DataType.Float)\nT1 = fd.ops.mul(T0, T0)\nfd.add_output(T1)")
SIZED = {"row_sum_short": (ROW_SUM, (8192, 96)), "row_sum_long_split": (ROW_SUM, (4, 1 << 20)),
         "pointwise_int64": (BIG_POINTWISE, (1 << 16, 1 << 16))}
# inner-outer variants (tests/codegen/test_codegen.py::test_inner_outer_variants_compile): odd row
# lengths (per-thread copies, no bulk copy), fewer rows than row groups, and shared memory too
# small for two rows per group (no prefetch; the groups' column sums still meet there)
IO_SMALL = ("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)\n"
            "T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)\n"
            "T2 = fd.ops.mul(T0, T1)\nT3 = fd.ops.sum(T2, dims=[1])\n"
            "T4 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[0])\n"
            "T5 = fd.ops.sub(T2, T4)\nT6 = fd.ops.sum(T0, dims=[0])\n"
            "T7 = fd.ops.sum(T5, dims=[0])\n"
            "fd.add_output(T5)\nfd.add_output(T6)\nfd.add_output(T7)")
IO_SIZED = {"inner_outer_few_rows": ((3, 37), None),
            "inner_outer_rows_of_300": ((1000, 300), None), "inner_outer_bulk": ((512, 4096), None),
            "inner_outer_no_prefetch": ((512, 4096), 40 * 1024)}


def _digest(kernels) -> str:
    """The source and every launch decision of one segment's kernels."""
    launch = [(k.name, [(p.kind, p.name, p.ctype) for p in k.params], list(k.grid),
               list(k.block), k.smem) for k in kernels.kernels]
    blob = json.dumps({"source": kernels.source, "kernels": launch,
                       "workspaces": [(w.name, w.nbytes) for w in kernels.workspaces],
                       "aligned": kernels.vector_aligned, "notes": kernels.notes},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def plans():
    """(name, plan) of every pinned case."""
    for name in CASES:
        parsed = parse_text((CORPUS / f"{name}.py").read_text())
        for size, metas in (("small", small_metas(parsed, 1 << 14)), ("full", parsed.inputs)):
            yield f"{name}/{size}", make_plan(parsed.fusion, metas, GREEDY)
    for name, (body, shape) in SIZED.items():
        f = fusion(body)
        dtype = f.tensors[f.inputs[0]].dtype
        yield name, make_plan(f, [tensor_meta(shape, dtype)], GREEDY)
    for name, (shape, smem) in IO_SIZED.items():
        f = fusion(IO_SMALL)
        options = PlanOptions(segmenter="greedy", time_limit_s=30,
                              device_overrides={"smem_per_block": smem} if smem else {})
        yield name, make_plan(f, [tensor_meta(shape, f.tensors[f.inputs[0]].dtype)] * 2, options)


def emitted() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, plan in plans():
        for seg in plan.segments:
            for vector in (None, 1):  # the vectorised kernels and their scalar fallback
                kernels = generate_segment(plan, seg, vector)
                if kernels.source:
                    out[f"{name}/segment{seg.index}/vector={vector}"] = _digest(kernels)
    return out


def test_the_emitted_cuda_of_the_pinned_fusions_is_unchanged():
    got = emitted()
    if os.environ.get("FUSECUT_REPIN_EMITTED"):
        PINS.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(PINS.read_text())
    assert len(pinned) >= 2 * len(CASES)
    changed = sorted(k for k in pinned.keys() | got.keys() if pinned.get(k) != got.get(k))
    assert not changed, f"emitted CUDA changed for {changed}"


def test_the_pins_cover_every_generated_kind_and_launch_shape():
    seen = set()
    for _, plan in plans():
        for seg in plan.segments:
            notes = generate_segment(plan, seg).notes
            seen |= {seg.kind.value, notes.get("layout"), notes.get("index_type")}
            seen |= {"split"} if notes.get("split", 1) > 1 else set()
            seen |= {"tiled"} if "written_through_tiles" in notes else set()
            seen |= {"prefetch"} if notes.get("prefetch_stages") else set()
    assert {"pointwise", "reduction", "normalization", "inner_outer", "inner", "outer", "int",
            "int64", "split", "tiled", "prefetch"} <= seen
