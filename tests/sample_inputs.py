"""Small concrete inputs for a definition that declares only symbolic (-1) extents.

nvFuser's test definitions rarely carry an ``inputs = [...]`` list; to plan and run them we try a
few uniform extents for every symbolic axis (declared extents are kept) and keep the first that
binds (shapes agree across broadcasts, reshapes and cats).
"""

from __future__ import annotations

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import FusecutError
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, tensor_meta

EXTENTS = (4, 8, 2, 16, 6, 1)
SCALAR_VALUES = {"bool": True, "int": 2, "float": 0.5}


def sample_metas(fusion: Fusion, extents=EXTENTS) -> list[InputMeta]:
    """The first candidate input metadata that binds; FusecutError (the last one) if none does."""
    last: FusecutError | None = None
    for n in extents:
        metas = [_meta(fusion, name, n) for name in fusion.inputs]
        try:
            bind(fusion, metas)
            return metas
        except FusecutError as e:
            last = e
    assert last is not None
    raise last


def _meta(fusion: Fusion, name: str, n: int) -> InputMeta:
    if name in fusion.scalars:
        dtype = fusion.scalars[name].dtype
        kind = "bool" if dtype.is_bool else "int" if dtype.is_int else "float"
        return ScalarMeta(dtype, SCALAR_VALUES[kind])
    t = fusion.tensors[name]
    shape = tuple(n if e == -1 else e for e in (t.declared_shape or ()))
    # integer tensors are often indices: keep them within the symbolic extent
    fill = {"low": 0, "high": max(n, 1)} if t.dtype.is_int else {}
    meta = tensor_meta(shape, t.dtype, **fill)
    if t.stride_order:  # stride_order[i] is the rank of axis i's stride (0 = innermost)
        order = sorted(range(len(shape)), key=lambda i: t.stride_order[i])
        strides = [0] * len(shape)
        step = 1
        for i in order:
            strides[i] = step
            step *= max(shape[i], 1)
        meta = tensor_meta(shape, t.dtype, tuple(strides), **fill)
    if any(b and e != 1 for e, b in zip(shape, t.broadcast)):  # symbolic broadcast: expanded
        meta = tensor_meta(shape, t.dtype, tuple(0 if b else s for s, b in zip(meta.strides,
                                                                                 t.broadcast)),
                           **fill)
    return meta
