"""The expression emitter: a tensor's value at a symbolic index, as CUDA statements.

Evaluation is pull-based: ``value(T, idx)`` emits T's producer with its operands evaluated at the
indices the op maps ``idx`` to (a broadcast operand at index 0 on its broadcast axes, a permuted
one at permuted indices, a reshaped one at the delinearised flat index, a sliced one at an offset,
padded and concatenated ones at clamped indices selected by range). Results are memoised by
(tensor, index), so a value used twice at one index is computed once. Reads of segment inputs go
to a ``load`` callback, which the kernel builders use to vectorise and hoist loads; values a
kernel computes itself (reduction results, on-chip buffers) are seeded into ``memo``.

A pull goes at most ``PULL_DEPTH`` producers deep: a value deeper down is computed first, on its
own, and the pull starts again from where it was (all it computed is memoised), so chains of
any length (20,000 ops) never exhaust Python's stack.

Indices are typed index expressions (``codegen.index``) of the kernel's index type, rendered
where a value's code reads them; values are ``Code`` (``codegen.code``): C expressions of the
value's compute type (float for 16-bit floats) with the names they read, and statements record
what they declare and read, so that nothing here decides by reading text back.

Generated code is meant to be read: the value of tensor T7 is declared as ``T7`` (``T7_1``... where
T7 is evaluated again at another index, lane or stage of the same kernel), with a comment giving
its op over IR names (``// T7 = sub(T3, T6)``), marked ``[recomputed]`` where the op also runs
in another segment. A cast to the value's own compute type emits nothing (the value is reused);
values nothing reads (a 16-bit result only stored, an unused reduction result) are dropped when
the source is assembled (``code.drop_unread``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fusecut.codegen import cuda
from fusecut.codegen.code import Code, Stmt, declare, derived, named
from fusecut.codegen.index import (
    LANE,
    LANE_VAR,
    ZERO,
    Add,
    All,
    AtLeast,
    Bool,
    Cast,
    Clamp,
    Const,
    Data,
    Div,
    Index,
    IndexExpr,
    Less,
    Mod,
    Mul,
    Paren,
    Select,
    Sub,
    contains,
    delinearize,
    is_atom,
    join_index,
    lane_base,
    linearize,
    plus_lane,
)
from fusecut.codegen.names import Names, describe_op, dynamic_scalars, value_name
from fusecut.codegen.resize import NO_RESIZES, VectorResizes
from fusecut.optimizer.analysis.axes import reshape_spans
from fusecut.optimizer.analysis.opclass import Role, role
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.ir.dtypes import DType, result_type
from fusecut.optimizer.ir.fusion import Op, Ref
from fusecut.optimizer.ir.ops_misc import reduction_axes
from fusecut.optimizer.ir.ops_shape import pad_widths_by_axis, slice_bounds

BOOL_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}
PULL_DEPTH = 50  # producers one pull may go through (about 5 Python frames each)


class _TooDeep(Exception):
    """A pull reached ``PULL_DEPTH``: ``key`` is to be computed first."""

    def __init__(self, emitter: Emitter, key: tuple[str, Index]):
        super().__init__(key)
        self.emitter, self.key = emitter, key


@dataclass(frozen=True)
class _Unrounded:
    """A 16-bit op's result, still in float (what a store takes); ``value`` declares its rounded
    value next. ``described``: the float's declaration already carries the op's comment."""

    value: Code
    described: bool = False


FlatIndex = Callable[[str, Index], "tuple[Code, Code] | None"]


class Emitter:
    """Emits the statements that compute tensors of a segment at symbolic indices. ``load``
    reads an input; ``fast``: tensors whose op may use fast math; ``flat_index``: a kernel that
    knows the row-major position of an index in its domain cheaply (the pointwise loop's flat
    counter) supplies it, flat_index(tensor, idx) -> (base, lane) expressions or None (random
    numbers need the linear index of each element); ``resizes``: the slices, pads and cats
    that keep the kernel's vectors whole (their pieces are read a vector at a time)."""

    def __init__(self, bound: Bound, ops: tuple[int, ...], inputs: set[str],
                 load: Callable[[str, Index], Code], itype: str, names: Names | None = None,
                 fast: frozenset[str] = frozenset(), flat_index: FlatIndex | None = None,
                 resizes: VectorResizes = NO_RESIZES):
        self.bound = bound
        self.fusion = bound.fusion
        self.producer = {o: i for i in ops for o in self.fusion.ops[i].outputs}
        self.inputs = inputs
        self.load = load
        self.itype = itype
        self.lines: list[Stmt] = []
        self.memo: dict[tuple[str, Index], Code] = {}
        self.dynamic = dynamic_scalars(bound)
        self.params: list[str] = []  # dynamic scalars used, in first-use order
        # Where values that do not vary within a loop are computed (e.g. once per row):
        # delegate(tensor, idx) returns an expression, or None to compute here (delegate_to).
        self.delegate: Callable[[str, Index], Code | None] | None = None
        # 16-bit results are computed in float; consumers get them rounded, stores take the
        # unrounded value (storing rounds it the same way): one conversion instead of three
        self._raw: dict[tuple[str, Index], Code] = {}
        self.fast = fast
        self.flat_index = flat_index
        self.names = names if names is not None else Names()
        self._depth = 0  # producers the current pull has gone through
        # joined index expression and extents -> the parts (see join)
        self.joined: dict[tuple[IndexExpr, tuple[int, ...]], Index] = {}
        self.joined_from: dict[tuple[Index, tuple[int, ...]], IndexExpr] = {}  # split's reverse
        # resizes read a vector at a time (codegen.resize), and the condition under which
        # each clamped vector index they made is read at all (see lane_guard)
        self.resizes = resizes
        self._piece_guards: dict[IndexExpr, IndexExpr] = {}

    def delegate_to(self, delegate: Callable[[str, Index], Code | None]) -> None:
        """Compute what ``delegate`` answers for elsewhere (see ``self.delegate``)."""
        self.delegate = delegate

    # ---- helpers ------------------------------------------------------------------------------

    def let(self, ctype: str, expr: Code, base: str, comment: str = "") -> Code:
        """Declare ``expr`` under a fresh name made from ``base``."""
        fresh = self.names.fresh(base)
        self.lines.append(declare(ctype, fresh, expr, comment))
        return named(fresh)

    def let_value(self, tensor: str, expr: Code, suffix: str = "", note: str = "") -> Code:
        """Declare ``expr`` as the value of ``tensor`` (of its compute type), commented with
        its op."""
        return self.let(cuda.compute(self.dtype(tensor)), expr, value_name(tensor) + suffix,
                        self.describe(tensor, note))

    def let_load(self, tensor: str, expr: Code) -> Code:
        return self.let(cuda.compute(self.dtype(tensor)), expr, value_name(tensor))

    def describe(self, tensor: str, note: str = "") -> str:
        """``T7 = sub(T3, T6)``: the op producing ``tensor`` over IR names."""
        i = self.producer.get(tensor)
        if i is None:
            return tensor + note
        op = self.fusion.ops[i]
        text = f"{tensor} = {describe_op(op)}"
        if len(op.outputs) > 1:
            text += f"[{op.outputs.index(tensor)}]"
        return text + note + ("  [recomputed]" if i in self.names.recomputed else "")

    def result(self, tensor: str, idx: Index, expr: Code) -> Stmt:
        """Declare a value the kernel computed itself (a reduction result); returns the
        statement, for the caller to place."""
        fresh = self.names.fresh(value_name(tensor))
        self.memo[(tensor, idx)] = named(fresh)
        return declare(cuda.compute(self.dtype(tensor)), fresh, expr, self.describe(tensor))

    def dtype(self, name: str) -> DType:
        return self.fusion.value_dtype(name)

    def scalar(self, scalar: str) -> Code:
        """A scalar as a C expression of its compute type: a literal, or a kernel parameter."""
        d = self.fusion.scalars[scalar].dtype
        if scalar in self.dynamic:
            if scalar not in self.params:
                self.params.append(scalar)
            return derived(f"(({cuda.compute(d)})s_{scalar})", f"s_{scalar}")
        value = self.bound.scalars.get(scalar)
        if value is None:
            raise PlanError(f"scalar {scalar} has no value at code generation time")
        return literal(value, d)

    def join(self, parts: Index, extents: tuple[int, ...]) -> IndexExpr:
        """The index of an axis made of a run of axes (row-major, outer first) from their
        indices; remembered, so that splitting it again gives the parts back."""
        whole = self.joined_from.get((parts, extents))
        if whole is not None:  # the parts were split from this index
            return whole
        expr = join_index(parts, extents)
        self.joined[(expr, extents)] = parts
        return expr

    def split(self, expr: IndexExpr, extents: tuple[int, ...]) -> Index:
        """The indices of a run of axes (extents ``extents``) that an axis indexed by ``expr``
        is made of: the parts it was joined from, else by division."""
        hit = self.joined.get((expr, extents))
        if hit is not None:
            return hit
        if len(extents) == 1:
            return (expr,)
        first = lane_base(expr)
        # the lanes of a vector within the innermost part share every other part: they are
        # the first lane's, and the innermost part is a vector's index again
        lanes = first is not None and self.resizes.width > 1 and \
            extents[-1] % self.resizes.width == 0
        whole = (first if is_atom(first) else Paren(first)) if lanes else expr
        out: list[IndexExpr] = []
        stride = math.prod(extents)
        for e in extents:
            stride //= e
            q = Paren(Div(whole, Const(stride))) if stride > 1 else whole
            out.append(q if len(out) == 0 else Paren(Mod(q, Const(e))))
        if lanes:
            out[-1] = plus_lane(out[-1])
        self.joined_from[(tuple(out), extents)] = expr
        return tuple(out)

    def lane_guard(self, component: IndexExpr) -> IndexExpr | None:
        """The condition under which a vector read at the index ``component`` is needed: a
        clamped piece index (``vector_piece``) is only read where the vector lies in its piece;
        as the condition is a function of the clamp alone, shared values stay sound."""
        conds = [c for clamp, c in self._piece_guards.items() if contains(component, clamp)]
        return All(*conds) if conds else None

    def vector_piece(self, base: IndexExpr, offset: int, extent: int, axis: int
                     ) -> tuple[IndexExpr, IndexExpr]:
        """A whole vector's index into a piece of ``extent`` elements at ``offset`` along an
        axis of ``axis`` elements, where ``base`` (a multiple of the vector width) indexes the
        vector's first lane, and the condition that the vector lies in the piece: (index,
        condition). The index is clamped into the piece, so a read outside its condition stays
        in bounds."""
        local = Paren(Sub(base, Const(offset))) if offset else base
        clamp = Clamp(local, extent - self.resizes.width, self.itype)
        # (a bound the axis implies is left out: a weaker condition, where it differs, only
        # reads more)
        bounds = ([AtLeast(base, Const(offset))] if offset else []) + \
            ([Less(base, Const(offset + extent))] if offset + extent < axis else [])
        if not bounds:  # the piece is the whole axis
            return plus_lane(clamp), Bool(True)
        cond = Paren(All(*bounds))
        self._piece_guards[clamp] = cond
        return plus_lane(clamp), cond

    def _whole_vector(self, tensor: str, axis: int, component: IndexExpr) -> IndexExpr | None:
        """The first lane's index of a vector read whole by resize ``tensor`` along ``axis``
        (where launch decided the resize keeps vectors whole and the lanes run along it)."""
        return lane_base(component) if self.resizes.whole(tensor, axis) else None

    def ref_int(self, x) -> int:
        return int(self.bound.scalars[x.name]) if isinstance(x, Ref) else int(x)

    def operand(self, operand: str, out_idx: Index, target: DType | None = None) -> Code:
        """An elementwise operand at the output's index (right-aligned, broadcast axes at 0),
        converted to compute type ``target`` if given."""
        if operand in self.fusion.scalars:
            expr, src = self.scalar(operand), self.dtype(operand)
        else:
            rank = len(self.bound.shapes[operand])
            off = len(out_idx) - rank
            flags = self.bound.broadcast[operand]
            idx = tuple(ZERO if flags[a] else out_idx[off + a] for a in range(rank))
            expr, src = self.value(operand, idx), self.dtype(operand)
        if target is not None and src.compute != target.compute:
            return derived(cuda.convert(expr, src.compute, target.compute), expr)
        return expr

    # ---- values -------------------------------------------------------------------------------

    def value(self, tensor: str, idx: Index) -> Code:
        key = (tensor, idx)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if self._depth == 0:
            return self._pull(key)
        if self._depth >= PULL_DEPTH:
            raise _TooDeep(self, key)
        self._depth += 1
        try:
            return self._compute(tensor, idx)
        finally:
            self._depth -= 1

    def _pull(self, key: tuple[str, Index]) -> Code:
        """A value pulled from outside the emitter: depth first, the deepest values before the
        ones that read them whenever a pull goes ``PULL_DEPTH`` deep. An abandoned op has emitted
        nothing of its own (its operands, complete, are memoised); it is evaluated again."""
        pending = [key]
        while pending:
            if pending[-1] in self.memo:
                pending.pop()
                continue
            self._depth = 1
            try:
                self._compute(*pending[-1])
                pending.pop()
            except _TooDeep as deeper:
                if deeper.emitter is not self:
                    raise
                pending.append(deeper.key)
            finally:
                self._depth = 0
        return self.memo[key]

    def _compute(self, tensor: str, idx: Index) -> Code:
        key = (tensor, idx)
        if self.delegate is not None:
            out = self.delegate(tensor, idx)
            if out is not None:
                self.memo[key] = out
                return out
        if tensor in self.inputs:
            out = self.load(tensor, idx)
        else:
            i = self.producer.get(tensor)
            if i is None:
                raise PlanError(f"{tensor} is neither computed by nor read by this kernel")
            out = self._op(self.fusion.ops[i], tensor, idx)
            if isinstance(out, _Unrounded):
                # Rounded right here even if only stores read it (they take the raw value): an
                # unread rounding is dropped from the source at the end (code.drop_unread),
                # while rounding at its first reader instead would move these conversions
                # (inline asm) between guarded stores and change the compiled branches.
                d = self.dtype(tensor)
                self._raw[key] = out.value
                note = f"{tensor} rounded to {d.value}" if out.described else \
                    self.describe(tensor)
                out = self.let(cuda.compute(d), derived(cuda.round_half(out.value, d), out.value),
                               value_name(tensor), note)
        self.memo[key] = out
        return out

    def raw(self, tensor: str, idx: Index) -> Code:
        """The value to store: for a computed 16-bit tensor, the float before rounding."""
        rounded = self.value(tensor, idx)
        return self._raw.get((tensor, idx), rounded)

    def _unrounded_let(self, tensor: str, expr: Code) -> _Unrounded:
        """A 16-bit op's result before rounding, declared as ``T7_f32``."""
        return _Unrounded(self.let_value(tensor, expr, "_f32", " (in float)"), True)

    def _op(self, op: Op, tensor: str, idx: Index) -> Code | _Unrounded:
        name = op.name
        out_dtype = self.dtype(tensor)
        if role(op, self.bound) is Role.REDUCTION:
            raise PlanError(f"reduction {tensor} must be computed by the kernel, not pulled")
        method = getattr(self, f"_op_{name}", None)
        if method is not None:
            return method(op, tensor, idx)
        if name in ("set", "segment_set"):
            return self.operand(op.inputs[0], idx)
        if name == "cast":
            src = self.dtype(op.inputs[0])
            x = self.operand(op.inputs[0], idx)
            if cuda.narrow(out_dtype) and src.compute is not DType.bool:
                if src.compute is DType.float32 and x.simple:
                    return _Unrounded(x)  # already a float: rounding it is the whole cast
                return self._unrounded_let(
                    tensor, x if src.compute is DType.float32 else derived(f"(float)({x})", x))
            converted = cuda.convert(x, src.compute, out_dtype)
            if converted is x and x.simple:
                return x  # the same compute type: the operand's value is this one
            return self.let_value(tensor, derived(converted, x))
        if name in ("sum", "max", "min", "prod", "var", "var_mean"):
            return self._trivial_reduction(op, tensor, idx)
        return self._elementwise(op, tensor, idx)

    def _constant_exponent(self, op: Op, ct: DType) -> float | None:
        """The exponent of a float ``pow`` by a compiled-in constant that torch computes
        without ``pow`` (``x.pow(2)`` of RMSNorm is ``x * x``: powf costs tens of
        instructions)."""
        if op.name != "pow" or not ct.is_float or len(op.inputs) != 2:
            return None
        exponent = op.inputs[1]
        if exponent not in self.fusion.scalars or exponent in self.dynamic:
            return None
        value = self.bound.scalars.get(exponent)
        return float(value) if value in cuda.SMALL_POWERS else None

    def _elementwise(self, op: Op, tensor: str, idx: Index) -> str:
        out_dtype = self.dtype(tensor)
        operands = list(op.inputs)
        value_operands = operands[1:] if op.name == "where" else operands
        tensors = [self.dtype(n) for n in value_operands if n in self.fusion.tensors]
        scalars = [self.dtype(n) for n in value_operands if n in self.fusion.scalars]
        if op.name in BOOL_OPS or (out_dtype.is_bool and op.name not in ("where",)):
            ct = result_type(tensors, scalars).compute if (tensors or scalars) else DType.bool
            if op.name in ("logical_and", "logical_or", "logical_xor", "logical_not"):
                ct = DType.bool if all(d.is_bool for d in tensors + scalars) else ct
        else:
            ct = out_dtype.compute
        if op.name == "where":
            args = [self.operand(operands[0], idx, DType.bool)] + \
                [self.operand(n, idx, ct) for n in operands[1:]]
        else:
            args = [self.operand(n, idx, ct) for n in operands]
        fast = tensor in self.fast
        power = self._constant_exponent(op, ct)
        if power is not None:
            expr = cuda.small_power(args[0], power, ct)
        elif len(args) == 1:
            expr = cuda.unary(op.name, args[0], ct, fast)
        elif len(args) == 2:
            expr = cuda.binary(op.name, args[0], args[1], ct, fast)
        elif op.name == "addcmul":
            expr = f"({args[0]} + {args[3]} * {args[1]} * {args[2]})"
        else:
            expr = cuda.ternary(op.name, *args, ct)
        # (a test whose answer the type decides, or a power 0, reads no operand)
        constant = (power == 0.0) if power is not None else \
            (len(args) == 1 and not cuda.reads_operand(op.name, ct))
        value = derived(expr, () if constant else args)
        if cuda.narrow(out_dtype):
            return self._unrounded_let(tensor, value)
        if cuda.compute(out_dtype) != cuda.compute(ct) and not out_dtype.is_bool:
            value = derived(f"({cuda.compute(out_dtype)})({expr})", value)
        return self.let_value(tensor, value)

    def _trivial_reduction(self, op: Op, tensor: str, idx: Index) -> str:
        """A reduction over broadcast axes only: a squeeze, times the expanded extent for sum."""
        src = op.inputs[0]
        shape = self.bound.shapes[src]
        axes = reduction_axes(op.attrs, len(shape))
        if op.attrs["keepdim"]:
            src_idx = tuple(ZERO if a in axes else idx[a] for a in range(len(shape)))
        else:
            it = iter(idx)
            src_idx = tuple(ZERO if a in axes else next(it) for a in range(len(shape)))
        out_dtype = self.dtype(tensor)
        v = self.value(src, src_idx)
        x = cuda.convert(v, self.dtype(src).compute, out_dtype.compute)  # v where types agree
        count = math.prod(shape[a] for a in axes)
        if op.name in ("var", "var_mean"):
            if tensor == op.outputs[0]:  # the values are all equal: variance 0 (nan if n <= corr)
                ct = out_dtype.compute
                undefined = count - op.attrs["correction"] <= 0
                return literal(float("nan") if undefined else 0.0, ct)
            return x if x is v else derived(x, v)
        if op.name == "sum" and count != 1:
            x = f"({x} * {cuda.literal(count, out_dtype.compute)})"
        elif op.name == "prod" and count != 1:
            x = "*".join([f"({x})"] * count) if count <= 4 else \
                f"{'pow' if out_dtype is DType.float64 else 'powf'}({x}, {count})"
        if cuda.narrow(out_dtype):
            x = cuda.round_half(x, out_dtype)
        if x is v and v.simple:
            return v  # a squeeze of a plain name: that value
        return self.let_value(tensor, derived(x, v))

    # ---- index-mapping ops ----------------------------------------------------------------------

    def operand_index(self, op: Op, idx: Index) -> Index:
        """The index of ``op``'s first operand that ``idx`` of its output reads (pure index
        transforms: broadcasts, squeeze, permute, reshape, slice)."""
        b = self.bound
        src = op.inputs[0]
        shape, flags = b.shapes[src], b.broadcast[src]
        rank = len(shape)
        name = op.name
        if name == "broadcast_in_dim":
            return tuple(ZERO if flags[i] else idx[d] for i, d in
                         enumerate(op.attrs["broadcast_dims"]))
        if name == "broadcast":
            kept = [j for j, f in enumerate(op.attrs["is_broadcast_dim"]) if not f]
            return tuple(ZERO if flags[i] else idx[j] for i, j in enumerate(kept))
        if name == "expand":
            return tuple(ZERO if flags[i] else idx[i] for i in range(rank))
        if name == "squeeze":
            dims = {d % rank for d in op.attrs["dims"]}
            it = iter(idx)
            return tuple(ZERO if a in dims else next(it) for a in range(rank))
        if name == "permute":
            inv = [0] * rank
            for j, a in enumerate(op.attrs["dims"]):
                inv[a % rank] = j
            return tuple(ZERO if flags[a] else idx[inv[a]] for a in range(rank))
        if name == "reshape":
            out_shape = b.shapes[op.outputs[0]]
            spans = reshape_spans(shape, out_shape)
            if spans is None:  # elements regrouped: through the flat index
                flat = linearize(idx, out_shape)
                return delinearize(flat, shape, flags)
            out: list[IndexExpr] = [ZERO] * rank  # extent-1 axes are in no span
            for ins, outs in spans:
                if len(ins) == 1:  # kept or split: the split parts make its index
                    out[ins[0]] = self.join(tuple(idx[j] for j in outs),
                                            tuple(out_shape[j] for j in outs))
                else:  # merged: its index splits back into theirs
                    for a, part in zip(ins, self.split(idx[outs[0]],
                                                       tuple(shape[a] for a in ins))):
                        out[a] = part
            return tuple(ZERO if flags[a] else out[a] for a in range(rank))
        if name == "slice":
            strides = op.attrs["strides"] or [1] * rank
            out = []
            for a in range(rank):
                if flags[a]:
                    out.append(ZERO)
                    continue
                s, _ = slice_bounds(shape[a], self.ref_int(op.attrs["start_indices"][a]),
                                    self.ref_int(op.attrs["end_indices"][a]),
                                    op.attrs["manual_normalization"])
                lane = self._whole_vector(op.outputs[0], a, idx[a]) if s else None
                if lane is not None:  # the vector, moved whole
                    out.append(Paren(Add(Const(s), lane, LANE_VAR)))
                    continue
                term = idx[a] if strides[a] == 1 else Mul(idx[a], Const(strides[a]))
                out.append(term if s == 0 else Paren(Add(Const(s), term)))
            return tuple(out)
        raise PlanError(f"{name} is not an index transform")

    def _op_broadcast_in_dim(self, op, tensor, idx):
        return self.value(op.inputs[0], self.operand_index(op, idx))

    _op_broadcast = _op_expand = _op_squeeze = _op_permute = _op_reshape = _op_slice = \
        _op_broadcast_in_dim

    def _op_pad(self, op, tensor, idx):
        src = op.inputs[0]
        shape, flags = self.bound.shapes[src], self.bound.broadcast[src]
        widths = [self.ref_int(w) for w in op.attrs["pad_widths"]]
        out_dtype = self.dtype(tensor)
        ctype = cuda.compute(out_dtype)
        pad = self.scalar(op.inputs[1]) if op.attrs.get("has_value") else \
            literal(0, out_dtype.compute)
        pad_type = cuda.compute(self.dtype(op.inputs[1])) if op.attrs.get("has_value") else ctype
        if pad_type != ctype:
            pad = derived(f"({ctype})({pad})", pad)
        if math.prod(shape) == 0:
            return self.let_value(tensor, pad)
        conds, src_idx = [], []
        for a, (lo, _) in enumerate(pad_widths_by_axis(len(shape), widths)):
            if lo == 0 and shape[a] == self.bound.shapes[tensor][a]:
                src_idx.append(ZERO if flags[a] else idx[a])
                continue
            lane = self._whole_vector(tensor, a, idx[a])
            if lane is not None:  # the whole vector is data or padding
                piece, cond = self.vector_piece(lane, lo, shape[a],
                                                self.bound.shapes[tensor][a])
                conds.append(cond)
                src_idx.append(piece)
                continue
            shifted = Paren(Sub(idx[a], Const(lo))) if lo else idx[a]
            conds.append(Paren(All(AtLeast(shifted, ZERO), Less(shifted, Const(shape[a])))))
            src_idx.append(ZERO if flags[a] else Clamp(shifted, shape[a] - 1, self.itype))
        inner = self.value(src, tuple(src_idx))
        if not conds:
            return inner
        return self.let_value(tensor, derived(f"({All(*conds)}) ? {inner} : {pad}",
                                              conds, inner, pad))

    def _op_cat(self, op, tensor, idx):
        dim = op.attrs["dim"] % len(self.bound.shapes[tensor])
        lane = self._whole_vector(tensor, dim, idx[dim])  # each vector in one piece
        pieces = []
        offset = 0
        for name in op.inputs:
            extent = self.bound.shapes[name][dim]
            if extent:
                flags = self.bound.broadcast[name]
                if lane is not None:
                    at = self.vector_piece(lane, offset, extent,
                                           self.bound.shapes[tensor][dim])[0]
                else:
                    local = Paren(Sub(idx[dim], Const(offset))) if offset else idx[dim]
                    at = Clamp(local, extent - 1, self.itype)
                src_idx = tuple(ZERO if flags[a] else (at if a == dim else idx[a])
                                for a in range(len(idx)))
                pieces.append((offset + extent, self.value(name, src_idx)))
            offset += extent
        if not pieces:  # every operand is empty along dim: so is the output, never read
            return self.let_value(tensor, literal(0, self.dtype(tensor)))
        at = idx[dim] if lane is None else lane
        expr = pieces[-1][1].text
        for end, val in reversed(pieces[:-1]):
            expr = f"({Less(at, Const(end))} ? {val} : {expr})"
        selects = at if len(pieces) > 1 else None  # one piece: no select reads the index
        return self.let_value(tensor, derived(expr, selects, [v for _, v in pieces]))

    def _gather_index(self, index_tensor: str, idx: Index, extent: int) -> IndexExpr:
        """The gathered position: the index tensor's value, from the end where negative,
        clamped into the axis."""
        raw = self.value(index_tensor, idx)
        at = Cast(Data(raw.text, raw.reads), self.itype)
        return Clamp(Select(Less(at, ZERO), Add(at, Const(extent)), at), extent - 1, self.itype)

    def _op_take_along_axis(self, op, tensor, idx):
        src, index = op.inputs
        dim = op.attrs["dim"] % len(idx)
        flags = self.bound.broadcast[src]
        extent = self.bound.shapes[src][dim]
        iflags = self.bound.broadcast[index]
        index_idx = tuple(ZERO if iflags[a] else idx[a] for a in range(len(idx)))
        pos = self._gather_index(index, index_idx, extent)
        src_idx = tuple(ZERO if flags[a] else (pos if a == dim else idx[a])
                        for a in range(len(idx)))
        return self.value(src, src_idx)

    _op_gather = _op_take_along_axis

    def _op_index_select(self, op, tensor, idx):
        src, index = op.inputs
        dim = op.attrs["dim"] % len(idx)
        extent = self.bound.shapes[src][dim]
        index_idx = (idx[dim],) if len(self.bound.shapes[index]) == 1 else ()
        if index_idx and self.bound.broadcast[index][0]:
            index_idx = (ZERO,)
        pos = self._gather_index(index, index_idx, extent)
        flags = self.bound.broadcast[src]
        src_idx = tuple(ZERO if flags[a] else (pos if a == dim else idx[a])
                        for a in range(len(idx)))
        return self.value(src, src_idx)

    def _op_full(self, op, tensor, idx):
        d = self.dtype(tensor)
        fill = self.scalar(op.inputs[0])
        return self.let_value(tensor, derived(cuda.convert(fill, self.dtype(op.inputs[0]).compute,
                                                           d), fill))

    def linear_index(self, tensor: str, idx: Index) -> tuple[Code, Code]:
        """The row-major linear index of ``idx`` in ``tensor``'s shape, as (base, lane): an
        unsigned 64-bit C expression and a small unsigned one to add to it."""
        if self.flat_index is not None:
            hit = self.flat_index(tensor, idx)
            if hit is not None:
                return hit
        lane = Code("0u")
        first = lane_base(idx[-1]) if idx else None
        # the vector lane apart: the lanes of a vector may then share a Philox block
        if first is not None:
            idx, lane = (*idx[:-1], first), derived(f"(unsigned int){LANE}", LANE)
        terms, used, stride = [], [], 1
        for i, e in zip(reversed(idx), reversed(self.bound.shapes[tensor])):
            if i != ZERO and e != 1:
                term = f"(unsigned long long)({i})"
                terms.append(term if stride == 1 else f"{term} * {stride}ULL")
                used.append(i)
            stride *= e
        base = "(" + " + ".join(reversed(terms)) + ")" if terms else "0ULL"
        return derived(base, used), lane

    def _op_uniform(self, op, tensor, idx):
        """Philox values of (seed, offset, linear index): see codegen.rng."""
        d = self.dtype(tensor)
        ct = DType.float64 if d is DType.float64 else DType.float32
        present = iter(op.inputs[2:])
        key = [self.scalar(next(present)) if op.attrs.get(f"has_{p}") else None
               for p in ("rng_seed", "rng_offset")]
        seed, offset = (f"(unsigned long long)({k})" if k is not None else "0ULL" for k in key)
        # uniform's bounds in its compute type; normal's mean and std always in double
        pt = ct if op.name == "uniform" else DType.float64
        bounds = [self.scalar(n) for n in op.inputs[:2]]
        a, b = (cuda.convert(x, self.dtype(n).compute, pt) for x, n in zip(bounds, op.inputs[:2]))
        fn = f"fc_{op.name}_{'d' if ct is DType.float64 else 'f'}"
        base, lane = self.linear_index(tensor, idx)
        expr = derived(f"{fn}({seed}, {offset}, {base}, {lane}, {a}, {b})", fn, key, base, lane,
                       a, b)
        if op.name == "uniform":  # [lo, hi) in the output type (preamble's fc_below_hi)
            below = {DType.float64: "fc_below_hi_d", DType.float16: "fc_below_hi_h",
                     DType.bfloat16: "fc_below_hi_bf"}.get(d, "fc_below_hi_f")
            expr = derived(f"{below}({expr}, {a}, {b})", below, expr, a, b)
        if d.is_half:
            return self._unrounded_let(tensor, expr)
        return self.let_value(tensor, expr)

    _op_normal = _op_uniform

    def _op_iota(self, op, tensor, idx):
        d = self.dtype(tensor)
        ct = cuda.compute(d)
        rest = iter(op.inputs[1:])
        start = self.scalar(next(rest)) if op.attrs.get("has_start") else Code("0")
        step = self.scalar(next(rest)) if op.attrs.get("has_step") else Code("1")
        pos = idx[0] if ct == {"int": "int", "int64": "long long"}.get(self.itype) else \
            f"({ct})({idx[0]})"
        return self.let_value(tensor, derived(f"({ct})({start}) + {pos} * ({ct})({step})",
                                              start, step, idx[0]))


def literal(value, d: DType) -> Code:
    """A constant of compute type ``d`` as a value (``true`` and ``false`` are plain words)."""
    return Code(cuda.literal(value, d), simple=d.is_bool)
