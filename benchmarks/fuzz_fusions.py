"""Random fusions for the GPU differential fuzzer (``benchmarks.gpu_fuzz``), one per seed.

``case(seed)`` builds a well-formed definition from fusecut's own vocabulary together with the
input metadata it runs on, deterministic for the seed. What a wrong kernel hides behind is what
the draws vary:

- input layouts: contiguous, permuted in memory (a channels-last tensor), strided (a slice of a
  larger buffer), broadcast (stride 0 along an axis of extent > 1), in any combination;
- shapes: odd extents, size-1 axes, and extents large enough for a reduction to be split across
  blocks (a workspace and a finishing kernel) and for every vector width;
- the families a model's regions are made of:
  - ``column_sum``: a bias gradient: a prologue on the whole domain (a product with a broadcast
    vector, a cast, another input), reached through a permute or a reshape of 2-, 3- and 4-D
    tensors, summed over leading, middle or trailing axes; the domain value is often an output
    too, as it is in a backward region;
  - ``normalization``: a reduction over trailing axes broadcast back (softmax, layer norm), with
    column sums of the same domain beside it (a layer norm's backward);
  - ``soup``: random unary, binary, comparison, cast, reduction, view and resize ops over a pool
    of values, as ``tests.strategies.fusions`` draws them.
- dtypes: float32, bfloat16 and float16 inputs and casts between them.

Plain ``random.Random(seed)``: a case is reproduced from its seed alone.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fusecut.optimizer.ir.builder import FusionBuilder
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import TensorMeta

FAMILIES = ("column_sum", "column_sum", "normalization", "soup", "soup")
FLOATS = (DType.float32, DType.float32, DType.bfloat16, DType.float16)
SMALL = (1, 2, 3, 5, 7, 8, 13, 16, 31, 33, 64, 96, 127, 130)
LARGE = (192, 256, 384, 1000, 1024, 3136)
MAX_ELEMENTS = 1 << 22  # 4M elements a tensor: a split reduction, yet a case in milliseconds
UNARY = ("neg", "abs", "exp", "tanh", "sigmoid", "sin", "cos", "relu", "erf", "silu")
UNARY_POSITIVE = ("reciprocal", "rsqrt", "sqrt", "log1p", "log")
BINARY = ("add", "sub", "mul", "maximum", "minimum", "div")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")


@dataclass
class Case:
    seed: int
    family: str
    fusion: Fusion
    inputs: list[TensorMeta]

    @property
    def label(self) -> str:
        return f"seed {self.seed} ({self.family})"


@dataclass
class _Value:
    handle: object
    shape: tuple[int, ...]
    dtype: DType


class _Draw:
    """One case being built: the builder, its inputs' metadata, and the seed's generator."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.b = FusionBuilder()
        self.metas: list[TensorMeta] = []

    def shape(self, rank: int, large: bool | None = None) -> tuple[int, ...]:
        large = self.rng.random() < 0.4 if large is None else large
        for _ in range(20):
            shape = tuple(self.rng.choice(LARGE if large and self.rng.random() < 0.5 else SMALL)
                          for _ in range(rank))
            if math.prod(shape) <= MAX_ELEMENTS:
                return shape
        return tuple(self.rng.choice(SMALL[:8]) for _ in range(rank))

    def layout(self, shape: tuple[int, ...], broadcast: bool = True) -> tuple[int, ...]:
        """Strides for a tensor of ``shape``: contiguous, permuted, strided or (``broadcast``)
        broadcast."""
        kind = self.rng.choice(("contiguous", "contiguous", "permuted", "strided", "broadcast",
                                "permuted_strided"))
        if kind == "broadcast" and not broadcast:
            kind = "contiguous"
        rank = len(shape)
        order = list(range(rank))  # memory order, outermost first
        padded = list(shape)
        if "permuted" in kind and rank > 1:
            self.rng.shuffle(order)
        if "strided" in kind and rank:
            axis = self.rng.randrange(rank)
            padded[axis] = shape[axis] + self.rng.choice((1, 3, shape[axis]))
        strides = [0] * rank
        acc = 1
        for axis in reversed(order):
            strides[axis] = acc
            acc *= max(padded[axis], 1)
        if kind == "broadcast":
            wide = [a for a in range(rank) if shape[a] > 1]
            if wide:
                strides[self.rng.choice(wide)] = 0
        return tuple(strides)

    def input(self, shape: tuple[int, ...], dtype: DType | None = None,
              strides: tuple[int, ...] | None = None, broadcast: bool = True) -> _Value:
        dtype = dtype or self.rng.choice(FLOATS)
        strides = self.layout(shape, broadcast) if strides is None else strides
        handle = self.b.define_tensor(sizes=list(shape), strides=list(strides), dtype=dtype)
        self.metas.append(TensorMeta(shape, strides, dtype, {}))
        return _Value(handle, shape, dtype)

    def op(self, name: str, args: list, out_shape: tuple[int, ...], out_dtype: DType,
           **attrs) -> _Value:
        """``name`` applied to ``args`` (attributes as keywords); its result's shape and dtype
        as the caller knows them, for drawing the next op."""
        (handle,) = self.b.op(name, args, attrs)
        return _Value(handle, out_shape, out_dtype)

    def cast(self, v: _Value, dtype: DType) -> _Value:
        return v if v.dtype == dtype else self.op("cast", [v.handle], v.shape, dtype, dtype=dtype)

    def positive(self, v: _Value) -> _Value:
        a = self.op("abs", [v.handle], v.shape, v.dtype)
        return self.op("add", [a.handle, 1.0], v.shape, v.dtype)

    def broadcast(self, v: _Value, shape: tuple[int, ...], dims: list[int]) -> _Value:
        return self.op("broadcast_in_dim", [v.handle], shape, v.dtype, shape=list(shape),
                       broadcast_dims=dims)

    def reduce(self, v: _Value, axes: list[int], keepdim: bool, name: str = "sum") -> _Value:
        shape = tuple(1 if a in axes else e for a, e in enumerate(v.shape)) if keepdim else \
            tuple(e for a, e in enumerate(v.shape) if a not in axes)
        return self.op(name, [v.handle], shape, v.dtype, dims=axes, keepdim=keepdim)

    def permute(self, v: _Value) -> _Value:
        perm = list(range(len(v.shape)))
        self.rng.shuffle(perm)
        return self.op("permute", [v.handle], tuple(v.shape[p] for p in perm), v.dtype,
                       dims=perm)

    def merge(self, v: _Value) -> _Value:
        """A reshape merging two adjacent axes (a [B, T, C] activation seen as [B*T, C])."""
        at = self.rng.randrange(len(v.shape) - 1)
        shape = v.shape[:at] + (v.shape[at] * v.shape[at + 1],) + v.shape[at + 2:]
        return self.op("reshape", [v.handle], shape, v.dtype, new_shape=list(shape))

    def split(self, v: _Value) -> _Value | None:
        """A reshape splitting an axis in two (a [B*T, C] gradient seen as [B, T, C])."""
        axes = [a for a, e in enumerate(v.shape) if e > 1 and _factor(e) is not None]
        if not axes:
            return None
        at = self.rng.choice(axes)
        f = _factor(v.shape[at])
        shape = v.shape[:at] + (f, v.shape[at] // f) + v.shape[at + 1:]
        return self.op("reshape", [v.handle], shape, v.dtype, new_shape=list(shape))

    def output(self, v: _Value) -> None:
        self.b.add_output(v.handle)


def _factor(e: int) -> int | None:
    return next((f for f in (2, 3, 4, 7, 8, 14, 16, 32) if e % f == 0 and e // f > 1), None)


def case(seed: int, family: str | None = None) -> Case:
    d = _Draw(seed)
    family = family or d.rng.choice(FAMILIES)
    {"column_sum": _column_sum, "normalization": _normalization, "soup": _soup}[family](d)
    return Case(seed, family, d.b.fusion, d.metas)


def _column_sum(d: _Draw) -> None:
    rank = d.rng.choice((2, 3, 3, 4, 4))
    shape = d.shape(rank)
    dtype = d.rng.choice(FLOATS)
    x = d.input(shape, dtype)
    # the tensor the sum reduces is reached through a view of the input, often a permute
    view = d.rng.choice(("none", "permute", "permute", "merge", "split"))
    v = _Value(x.handle, x.shape, x.dtype)
    if view == "permute":
        v = d.permute(v)
    elif view == "merge" and rank > 2:
        v = d.merge(v)
    elif view == "split":
        v = d.split(v) or v
    v = d.cast(v, DType.float32) if d.rng.random() < 0.7 else v
    # a prologue on the domain: a layer-scale vector along the last axis, another input
    if d.rng.random() < 0.6:
        g = d.input((v.shape[-1],), v.dtype, (1,))
        gb = d.broadcast(g, v.shape, [len(v.shape) - 1])
        v = d.op("mul", [gb.handle, v.handle], v.shape, v.dtype)
    if d.rng.random() < 0.4:
        other = d.input(v.shape, v.dtype)
        v = d.op(d.rng.choice(("mul", "add")), [v.handle, other.handle], v.shape, v.dtype)
    if d.rng.random() < 0.5:
        d.output(d.cast(v, dtype))  # the domain value leaves the region too
    rank = len(v.shape)
    choice = d.rng.choice(("all_but_last", "all_but_last", "leading", "middle", "trailing",
                           "random"))
    if choice == "all_but_last" or rank == 1:
        axes = list(range(max(rank - 1, 1)))
    elif choice == "leading":
        axes = list(range(d.rng.randrange(1, rank)))
    elif choice == "middle" and rank > 2:
        axes = [d.rng.randrange(1, rank - 1)]
    elif choice == "trailing":
        axes = list(range(d.rng.randrange(1, rank), rank))
    else:
        axes = sorted(d.rng.sample(range(rank), d.rng.randrange(1, rank + 1)))
    name = d.rng.choice(("sum", "sum", "sum", "max", "min"))
    r = d.reduce(v, axes, d.rng.random() < 0.3, name)
    if d.rng.random() < 0.3:
        r = d.op("mul", [r.handle, 0.5], r.shape, r.dtype)
    d.output(d.cast(r, dtype) if d.rng.random() < 0.5 else r)


def _normalization(d: _Draw) -> None:
    rank = d.rng.choice((2, 3))
    shape = d.shape(rank)
    dtype = d.rng.choice(FLOATS)
    # a row constant along a normalized axis makes its centred values rounding noise that the
    # normalization then scales up: a broadcast input would fail on the reference's roundings
    x = d.cast(d.input(shape, dtype, broadcast=False), DType.float32)
    if d.rng.random() < 0.3:
        x = d.permute(x)
    shape = x.shape
    inner = [rank - 1] if rank == 2 or d.rng.random() < 0.7 else [rank - 2, rank - 1]
    kept = [a for a in range(rank) if a not in inner]
    kind = d.rng.choice(("softmax", "layernorm", "rms"))
    if kind == "softmax":
        m = d.broadcast(d.reduce(x, inner, False, "max"), shape, kept)
        e = d.op("exp", [d.op("sub", [x.handle, m.handle], shape, x.dtype).handle], shape,
                 x.dtype)
        s = d.broadcast(d.reduce(e, inner, False), shape, kept)
        y = d.op("div", [e.handle, s.handle], shape, x.dtype)
    else:
        n = math.prod(shape[a] for a in inner)
        centred = x
        if kind == "layernorm":
            mean = d.op("div", [d.reduce(x, inner, False).handle, float(n)],
                        tuple(shape[a] for a in kept), x.dtype)
            centred = d.op("sub", [x.handle, d.broadcast(mean, shape, kept).handle], shape,
                           x.dtype)
        sq = d.op("mul", [centred.handle, centred.handle], shape, x.dtype)
        var = d.op("div", [d.reduce(sq, inner, False).handle, float(n)],
                   tuple(shape[a] for a in kept), x.dtype)
        rstd = d.op("rsqrt", [d.op("add", [var.handle, 1e-5], var.shape, x.dtype).handle],
                    var.shape, x.dtype)
        y = d.op("mul", [centred.handle, d.broadcast(rstd, shape, kept).handle], shape, x.dtype)
    if d.rng.random() < 0.6:
        w = d.input((shape[-1],), d.rng.choice(FLOATS), (1,))
        wb = d.broadcast(d.cast(w, DType.float32), shape, [rank - 1])
        y = d.op("mul", [y.handle, wb.handle], shape, x.dtype)
    d.output(d.cast(y, dtype))
    if d.rng.random() < 0.5:  # a weight gradient: column sums of the same domain
        d.output(d.reduce(d.op("mul", [y.handle, x.handle], shape, x.dtype), kept, False))


def _soup(d: _Draw) -> None:
    rank = d.rng.choice((1, 2, 3, 3, 4))
    base = d.shape(rank)
    pool: list[_Value] = []
    for _ in range(d.rng.randrange(1, 4)):
        shape = tuple(1 if d.rng.random() < 0.15 else e for e in base)
        pool.append(d.input(shape))
    first = len(pool)
    reduced: list[tuple[_Value, tuple[int, ...], list[int]]] = []
    for _ in range(d.rng.randrange(1, 12)):
        t = d.rng.choice(pool)
        new = _soup_op(d, t, pool, reduced, base)
        if new is not None:
            pool.append(new)
    made = pool[first:] or pool
    for v in d.rng.sample(made, d.rng.randrange(1, min(3, len(made)) + 1)):
        d.output(v)


def _soup_op(d: _Draw, t: _Value, pool: list[_Value], reduced: list, base) -> _Value | None:
    kind = d.rng.choice(("unary", "binary", "binary", "scalar", "cast", "where", "reduce",
                         "reduce", "bcast_back", "permute", "reshape", "slice", "pad"))
    rank = len(t.shape)
    if kind == "unary":
        name = d.rng.choice(UNARY + UNARY_POSITIVE)
        src = d.positive(t) if name in UNARY_POSITIVE else t
        return d.op(name, [src.handle], t.shape, t.dtype)
    if kind in ("binary", "where"):
        # partners that broadcast with t to no more than MAX_ELEMENTS (a merged axis beside
        # another value's broadcast one multiplies extents: 5,402 GiB once)
        partners = [u for u in pool if len(u.shape) == rank
                    and all(x == y or x == 1 or y == 1 for x, y in zip(u.shape, t.shape))
                    and math.prod(max(x, y) for x, y in zip(u.shape, t.shape)) <= MAX_ELEMENTS]
        if not partners:  # t itself is too large to pair: draw again
            return None
        u = d.rng.choice(partners)
        shape = tuple(y if x == 1 else x for x, y in zip(t.shape, u.shape))
        dtype = t.dtype if t.dtype == u.dtype else DType.float32
        if kind == "binary":
            name = d.rng.choice(BINARY)
            rhs = d.positive(u) if name == "div" else u
            return d.op(name, [t.handle, rhs.handle], shape, dtype)
        c = d.op(d.rng.choice(COMPARE), [t.handle, u.handle], shape, DType.bool)
        return d.op("where", [c.handle, t.handle, u.handle], shape, dtype)
    if kind == "scalar":
        return d.op(d.rng.choice(("mul", "add", "sub")), [t.handle, d.rng.choice((0.5, -1.25, 3))],
                    t.shape, t.dtype)
    if kind == "cast":
        return d.cast(t, d.rng.choice(FLOATS))
    if kind == "reduce" and rank:
        axes = sorted(d.rng.sample(range(rank), d.rng.randrange(1, rank + 1)))
        keep = d.rng.random() < 0.4
        r = d.reduce(t, axes, keep, d.rng.choice(("sum", "max", "min")))
        if not keep:
            reduced.append((r, t.shape, [a for a in range(rank) if a not in axes]))
        return r
    if kind == "bcast_back" and reduced:
        r, shape, kept = d.rng.choice(reduced)
        return d.broadcast(r, shape, kept)
    if kind == "permute" and rank > 1:
        return d.permute(t)
    if kind == "reshape" and rank > 1:
        return d.merge(t)
    if kind == "slice" and rank:
        starts = [d.rng.randrange(0, max(e, 1)) if e > 1 else 0 for e in t.shape]
        ends = [d.rng.randrange(s + 1, e + 1) if e > s else e for s, e in zip(starts, t.shape)]
        return d.op("slice", [t.handle], tuple(b - a for a, b in zip(starts, ends)), t.dtype,
                    start_indices=starts, end_indices=ends)
    if kind == "pad" and rank:
        lo, hi = d.rng.randrange(3), d.rng.randrange(3)
        return d.op("pad", [t.handle], t.shape[:-1] + (t.shape[-1] + lo + hi,), t.dtype,
                    pad_widths=[lo, hi])
    return None

