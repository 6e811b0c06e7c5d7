"""Hypothesis strategies: random well-formed fusions over fusecut's op vocabulary.

``fusions()`` draws a definition together with concrete input metadata. It builds through the
FusionBuilder, choosing operands whose shapes fit each op, so every draw is valid by construction.
Knobs restrict the vocabulary (views, reductions, dtypes) for the callers that need it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from fusecut.optimizer.ir.builder import FusionBuilder
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta, tensor_meta

UNARY_SAFE = ["neg", "abs", "exp", "tanh", "sigmoid", "sin", "cos", "relu", "erf", "silu",
              "reciprocal", "rsqrt", "sqrt", "log1p"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "div"]
COMPARE = ["lt", "le", "gt", "ge", "eq", "ne"]
EXTENTS = [1, 2, 3, 4, 5, 7, 8, 13, 16]


@dataclass
class Drawn:
    fusion: Fusion
    inputs: list[InputMeta]


@dataclass
class _T:
    handle: object
    shape: tuple[int, ...]
    dtype: DType


def _positive(b: FusionBuilder, t: _T) -> _T:
    """abs(x) + 1: a safe operand for log/sqrt/reciprocal."""
    (a,) = b.op("abs", [t.handle], {})
    (p,) = b.op("add", [a, 1.0], {})
    return _T(p, t.shape, t.dtype)


@st.composite
def fusions(draw, max_ops: int = 10, views: bool = True, reductions: bool = True,
            dtypes: tuple[DType, ...] = (DType.float32, DType.bfloat16, DType.float16),
            max_rank: int = 3, extents: list[int] | None = None) -> Drawn:
    extents = extents or EXTENTS
    b = FusionBuilder()
    rank = draw(st.integers(1, max_rank))
    base = tuple(draw(st.sampled_from(extents)) for _ in range(rank))
    pool: list[_T] = []
    metas: list[InputMeta] = []
    reduced: list[tuple[_T, tuple[int, ...], list[int]]] = []  # for broadcast-back
    for _ in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(dtypes))
        bcast = [draw(st.booleans()) and draw(st.booleans()) for _ in range(rank)]
        shape = tuple(1 if bc else e for bc, e in zip(bcast, base))
        decl = [1 if e == 1 else -1 for e in shape]
        handle = b.define_tensor(decl, [None if e == 1 else True for e in shape], dtype)
        metas.append(tensor_meta(shape, dtype))
        pool.append(_T(handle, shape, dtype))
    n_ops = draw(st.integers(1, max_ops))
    kinds = ["unary", "binary", "binary", "scalar", "cast", "where"]
    if reductions:
        kinds += ["reduce", "reduce", "bcast_back", "var_mean"]
    if views:
        kinds += ["permute", "reshape", "slice", "pad", "cat", "squeeze_bcast"]
    kinds += ["full"]
    for _ in range(n_ops):
        kind = draw(st.sampled_from(kinds))
        t = draw(st.sampled_from(pool))
        new: _T | None = None
        if kind == "unary":
            name = draw(st.sampled_from(UNARY_SAFE))
            src = _positive(b, t) if name in ("reciprocal", "rsqrt", "sqrt", "log1p") else t
            (h,) = b.op(name, [src.handle], {})
            new = _T(h, t.shape, t.dtype)
        elif kind in ("binary", "where"):
            partners = [u for u in pool if len(u.shape) == len(t.shape)
                        and all(x == y or x == 1 or y == 1 for x, y in zip(u.shape, t.shape))]
            u = draw(st.sampled_from(partners))
            shape = tuple(y if x == 1 else x for x, y in zip(t.shape, u.shape))  # 1 with 0: 0
            dtype = t.dtype if t.dtype == u.dtype else DType.float32
            if kind == "binary":
                name = draw(st.sampled_from(BINARY))
                rhs = _positive(b, u).handle if name == "div" else u.handle
                (h,) = b.op(name, [t.handle, rhs], {})
            else:
                (c,) = b.op(draw(st.sampled_from(COMPARE)), [t.handle, u.handle], {})
                (h,) = b.op("where", [c, t.handle, u.handle], {})
            new = _T(h, shape, dtype)
        elif kind == "scalar":
            value = draw(st.sampled_from([0.5, 2.0, -1.25, 3]))
            (h,) = b.op(draw(st.sampled_from(["mul", "add", "sub"])), [t.handle, value], {})
            new = _T(h, t.shape, t.dtype)
        elif kind == "cast":
            dtype = draw(st.sampled_from([d for d in dtypes] + [DType.float32]))
            (h,) = b.op("cast", [t.handle], {"dtype": dtype})
            new = _T(h, t.shape, dtype)
        elif kind == "reduce" and t.shape:
            axes = sorted(set(draw(st.lists(st.integers(0, len(t.shape) - 1), min_size=1,
                                            max_size=len(t.shape)))))
            keep = draw(st.booleans())
            name = draw(st.sampled_from(["sum", "max", "min"]))
            (h,) = b.op(name, [t.handle], {"dims": axes, "keepdim": keep})
            kept = [i for i in range(len(t.shape)) if i not in axes]
            shape = tuple(1 if i in axes else e for i, e in enumerate(t.shape)) if keep else \
                tuple(t.shape[i] for i in kept)
            new = _T(h, shape, t.dtype)
            if not keep:
                reduced.append((new, t.shape, kept))
        elif kind == "var_mean" and t.shape:
            axis = draw(st.integers(0, len(t.shape) - 1))
            var, mean = b.op("var_mean", [t.handle], {"dims": [axis], "correction": 0})
            kept = [i for i in range(len(t.shape)) if i != axis]
            shape = tuple(t.shape[i] for i in kept)
            dtype = t.dtype if t.dtype.is_float else DType.float32
            pool.append(_T(var, shape, dtype))
            new = _T(mean, shape, dtype)
            reduced.append((new, t.shape, kept))
        elif kind == "bcast_back" and reduced:
            r, shape, kept = draw(st.sampled_from(reduced))
            (h,) = b.op("broadcast_in_dim", [r.handle], {"shape": list(shape),
                                                          "broadcast_dims": kept})
            new = _T(h, shape, r.dtype)
        elif kind == "permute" and len(t.shape) > 1:
            perm = draw(st.permutations(range(len(t.shape))))
            (h,) = b.op("permute", [t.handle], {"dims": list(perm)})
            new = _T(h, tuple(t.shape[i] for i in perm), t.dtype)
        elif kind == "reshape" and len(t.shape) > 1:
            shape = t.shape[:-2] + (t.shape[-2] * t.shape[-1],)
            (h,) = b.op("reshape", [t.handle], {"new_shape": list(shape)})
            new = _T(h, shape, t.dtype)
        elif kind == "slice" and t.shape:
            starts, ends = [], []
            for e in t.shape:
                s = draw(st.integers(0, max(e - 1, 0)))
                starts.append(s)
                ends.append(draw(st.integers(s, e)))
            (h,) = b.op("slice", [t.handle], {"start_indices": starts, "end_indices": ends})
            new = _T(h, tuple(y - x for x, y in zip(starts, ends)), t.dtype)
        elif kind == "pad" and t.shape:
            lo, hi = draw(st.integers(0, 2)), draw(st.integers(0, 2))
            (h,) = b.op("pad", [t.handle], {"pad_widths": [lo, hi]})
            new = _T(h, t.shape[:-1] + (t.shape[-1] + lo + hi,), t.dtype)
        elif kind == "cat" and t.shape:
            dim = draw(st.integers(0, len(t.shape) - 1))
            partners = [u for u in pool if u.dtype == t.dtype and len(u.shape) == len(t.shape)
                        and all(x == y for i, (x, y) in enumerate(zip(u.shape, t.shape))
                                if i != dim)]
            u = draw(st.sampled_from(partners))
            (h,) = b.op("cat", [[t.handle, u.handle]], {"dim": dim})
            shape = tuple(x + y if i == dim else x for i, (x, y) in enumerate(zip(t.shape,
                                                                                   u.shape)))
            new = _T(h, shape, t.dtype)
        elif kind == "squeeze_bcast" and 1 in t.shape:
            dims = [i for i, e in enumerate(t.shape) if e == 1]
            (h,) = b.op("squeeze", [t.handle], {"dims": dims[:1]})
            new = _T(h, tuple(e for i, e in enumerate(t.shape) if i != dims[0]), t.dtype)
        elif kind == "full":
            (h,) = b.op("full", [], {"shape": list(base), "fill_value": 1.5,
                                     "dtype": DType.float32})
            new = _T(h, base, DType.float32)
        if new is not None:
            pool.append(new)
    produced = pool[len(metas):] or pool
    n_out = draw(st.integers(1, min(3, len(produced))))
    outs = draw(st.lists(st.sampled_from(produced), min_size=n_out, max_size=n_out,
                         unique_by=lambda t: t.handle.name))
    for t in outs:
        b.add_output(t.handle)
    return Drawn(b.fusion, metas)


@st.composite
def resized_reductions(draw) -> Drawn:
    """A reduction meeting resizes (slice, pad, cat) along its kept axes on either side: rotated
    halves of its input (a reduction kernel's prologue reads them at a shift) or of its result
    (its epilogue would), optionally with Thunder's cast, broadcast to a size-1 axis and sum over
    that axis in between. What RoPE's backward with grouped-query heads is made of."""
    b = FusionBuilder()
    rank = draw(st.integers(2, 3))
    shape = tuple(draw(st.sampled_from([2, 3, 4, 8])) for _ in range(rank))
    dtype = draw(st.sampled_from([DType.float32, DType.bfloat16]))
    t = _T(b.define_tensor([-1] * rank, [True] * rank, dtype), shape, dtype)
    reduced = sorted(set(draw(st.lists(st.integers(0, rank - 1), min_size=1,
                                       max_size=rank - 1))))
    kept = [a for a in range(rank) if a not in reduced]
    if draw(st.booleans()):
        t = _rotate_half(draw, b, t, draw(st.sampled_from(kept)))
    (h,) = b.op(draw(st.sampled_from(["sum", "max"])), [t.handle], {"dims": reduced,
                                                                   "keepdim": False})
    r = _T(h, tuple(shape[a] for a in kept), dtype)
    if draw(st.booleans()):
        (c,) = b.op("cast", [r.handle], {"dtype": DType.bfloat16})
        at = draw(st.integers(0, len(r.shape)))
        (one,) = b.op("broadcast_in_dim", [c], {
            "shape": list(r.shape[:at] + (1,) + r.shape[at:]),
            "broadcast_dims": [a for a in range(len(r.shape) + 1) if a != at]})
        (f,) = b.op("cast", [one], {"dtype": DType.float32})
        (h,) = b.op("sum", [f], {"dims": [at], "keepdim": False})
        r = _T(h, r.shape, DType.float32)
    out = _rotate_half(draw, b, r, draw(st.integers(0, len(r.shape) - 1))) \
        if draw(st.booleans()) else r
    b.add_output(out.handle)
    if out is not r and draw(st.booleans()):
        b.add_output(r.handle)
    return Drawn(b.fusion, [tensor_meta(shape, dtype)])


def _rotate_half(draw, b: FusionBuilder, t: _T, axis: int) -> _T:
    """``t + [-t[k:], t[:k]]`` along ``axis`` (RoPE's rotate_half at split ``k``), the halves
    put together by a cat or by two pads and an add."""
    e, rank = t.shape[axis], len(t.shape)
    if e < 2:
        return t
    k = draw(st.integers(1, e - 1))

    def cut(lo: int, hi: int):
        (h,) = b.op("slice", [t.handle], {
            "start_indices": [lo if a == axis else 0 for a in range(rank)],
            "end_indices": [hi if a == axis else x for a, x in enumerate(t.shape)]})
        return h

    def pad(h, before: int, after: int):
        widths = [0] * (2 * (rank - axis))
        widths[-2:] = [before, after]
        (p,) = b.op("pad", [h], {"pad_widths": widths})
        return p

    (hi,) = b.op("neg", [cut(k, e)], {})
    lo = cut(0, k)
    if draw(st.booleans()):
        (rotated,) = b.op("cat", [[hi, lo]], {"dim": axis})
    else:
        (rotated,) = b.op("add", [pad(hi, 0, k), pad(lo, e - k, 0)], {})
    (h,) = b.op("add", [t.handle, rotated], {})
    return _T(h, t.shape, t.dtype)
