"""Random ops without a seed: run-time scalar inputs that each call draws afresh.

nvFuser gives a ``uniform``/``normal`` without ``rng_seed``/``rng_offset`` the seed and offset
of torch's generator at every execution (``GetRNGSeedAndOffsetFromHost``): op ``j`` of the
fusion's unseeded random ops draws Philox counter offset ``torch_offset / 4 + j`` and the
generator's offset advances by ``4 * ops``. fusecut does the same by making those ops seeded:
``seed_implicit_rng`` gives each one two extra scalar operands, a seed shared by all and an
offset of its own, as new fusion inputs after the caller's (``Fusion.implicit_rng`` names them).
They are operands of random ops, so the plan never bakes them (``analysis.scalars``): one plan
and one compiled program serve every draw, and the runtime (``runtime.rng``) appends the values
to the caller's arguments on every call. A random op read by two segments is one op with one
pair of inputs, so both segments draw the same numbers.

Only ops with neither ``rng_seed`` nor ``rng_offset`` are rewritten; one with either keeps its
meaning (an absent one is 0). A plan's identity (fusion id, plan id) is that of the fusion as
written (``as_written``), so that a client, the service's cache key and a worker rebuilding the
plan all name it alike.
"""

from __future__ import annotations

import dataclasses

from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Fusion, Op, ScalarValue
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta

SEED_NAME = "rng_seed_implicit"
OFFSET_NAME = "rng_offset_implicit"


def unseeded_random_ops(fusion: Fusion) -> list[int]:
    """Indices of the random ops that take neither seed nor offset, in program order."""
    return [i for i, op in enumerate(fusion.ops)  # random ops are those with the attribute
            if "has_rng_seed" in op.attrs and not op.attrs["has_rng_seed"]
            and not op.attrs.get("has_rng_offset")]


def _fresh(fusion: Fusion, base: str) -> str:
    name, k = base, 0
    while name in fusion.scalars or name in fusion.tensors:
        k += 1
        name = f"{base}{k}"
    return name


def seed_implicit_rng(fusion: Fusion, metas: list[InputMeta]
                      ) -> tuple[Fusion, list[InputMeta]]:
    """``fusion`` with its unseeded random ops seeded by new trailing scalar inputs, and
    ``metas`` extended by those inputs' metadata (no values: they change every call). The
    fusion itself when it has no such op, or when ``metas`` do not fit it (binding then says
    what is wrong, in the caller's terms)."""
    ops = unseeded_random_ops(fusion)
    if not ops or fusion.implicit_rng or len(metas) != len(fusion.inputs):
        return fusion, metas
    scalars = dict(fusion.scalars)
    seed = _fresh(fusion, SEED_NAME)
    scalars[seed] = ScalarValue(seed, DType.int64)
    new_ops = list(fusion.ops)
    hidden = [seed]
    for j, i in enumerate(ops):
        offset = _fresh(fusion, f"{OFFSET_NAME}{j}")
        scalars[offset] = ScalarValue(offset, DType.int64)
        hidden.append(offset)
        op = fusion.ops[i]
        new_ops[i] = Op(op.name, (*op.inputs[:2], seed, offset), op.outputs,
                        dict(op.attrs, has_rng_seed=True, has_rng_offset=True))
    seeded = dataclasses.replace(fusion, scalars=scalars, ops=new_ops,
                                 inputs=[*fusion.inputs, *hidden], implicit_rng=tuple(hidden))
    return seeded, [*metas, *(ScalarMeta(DType.int64) for _ in hidden)]


def as_written(fusion: Fusion) -> Fusion:
    """``fusion`` as its caller wrote it: ``seed_implicit_rng`` undone (the fusion itself when
    it has no implicit inputs)."""
    hidden = set(fusion.implicit_rng)
    if not hidden:
        return fusion
    ops = [Op(op.name, op.inputs[:2], op.outputs,
              dict(op.attrs, has_rng_seed=False, has_rng_offset=False))
           if hidden.intersection(op.inputs[2:]) else op for op in fusion.ops]
    return dataclasses.replace(
        fusion, ops=ops, implicit_rng=(),
        scalars={n: v for n, v in fusion.scalars.items() if n not in hidden},
        inputs=fusion.caller_inputs())
