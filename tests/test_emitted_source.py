"""The generated CUDA of a few corpus fusions, pinned: a change meant to move code around in
codegen/ (not to change a kernel) must leave every byte of the source, and every launch
decision, as it was. A change that means to change kernels re-pins them:

    FUSECUT_REPIN_EMITTED=1 .venv/bin/python -m pytest -q tests/test_emitted_source.py

and the commit shows the new digests beside the kernels it changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from codegen import generate_segment
from optimizer.ir import parse_text
from optimizer.planner import PlanOptions, make_plan
from tests.conftest import CORPUS
from tests.helpers import small_metas

PINS = Path(__file__).parent / "data" / "emitted_sources.json"
# one or more of each generated kind: pointwise, transpose, reduction, normalization,
# inner_outer, at a small size and at the repro's own (64-bit indexing, other launch shapes)
CASES = ("gelu_tanh_fwd", "adam_step", "transpose_add", "seed_3334_reduction_broadcast_pointwise",
         "layernorm_fwd", "rmsnorm_fwd", "layernorm_bwd", "seed_2146_rmsnorm_bwd",
         "bias_dropout_add_layernorm", "group_norm_fwd")
GREEDY = PlanOptions(segmenter="greedy", time_limit_s=30)


def _digest(kernels) -> str:
    """The source and every launch decision of one segment's kernels."""
    launch = [(k.name, [(p.kind, p.name, p.ctype) for p in k.params], list(k.grid),
               list(k.block), k.smem) for k in kernels.kernels]
    blob = json.dumps({"source": kernels.source, "kernels": launch,
                       "workspaces": [(w.name, w.nbytes) for w in kernels.workspaces],
                       "aligned": kernels.vector_aligned, "notes": kernels.notes},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def emitted() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in CASES:
        parsed = parse_text((CORPUS / f"{name}.py").read_text())
        for size, metas in (("small", small_metas(parsed, 1 << 14)), ("full", parsed.inputs)):
            plan = make_plan(parsed.fusion, metas, GREEDY)
            for seg in plan.segments:
                for vector in (None, 1):  # the vectorised kernels and their scalar fallback
                    kernels = generate_segment(plan, seg, vector)
                    if kernels.source:
                        key = f"{name}/{size}/segment{seg.index}/vector={vector}"
                        out[key] = _digest(kernels)
    return out


def test_the_emitted_cuda_of_the_pinned_fusions_is_unchanged():
    got = emitted()
    if os.environ.get("FUSECUT_REPIN_EMITTED"):
        PINS.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(PINS.read_text())
    assert len(pinned) >= 2 * len(CASES)
    changed = sorted(k for k in pinned.keys() | got.keys() if pinned.get(k) != got.get(k))
    assert not changed, f"emitted CUDA changed for {changed}"


@pytest.mark.parametrize("kind", ["pointwise", "reduction", "normalization", "inner_outer"])
def test_the_pins_cover_every_generated_kind(kind):
    kinds = set()
    for name in CASES:
        parsed = parse_text((CORPUS / f"{name}.py").read_text())
        kinds |= {s.kind.value for s in make_plan(parsed.fusion, parsed.inputs, GREEDY).segments}
    assert kind in kinds
