"""Generated kernels: their source, parameters and launch configuration, and the reduction
accumulators (types, identities, combine functors) they share. The device helpers they call
are in ``codegen.preamble``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from fusecut.codegen import cuda
from fusecut.codegen.code import Code, Stmt, derived, drop_unread, stmt, text_of
from fusecut.codegen.names import describe_op
from fusecut.codegen.preamble import preamble
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Op
from fusecut.optimizer.ir.ops_misc import reduction_axes


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel. An "extent" is an extent of the domain the kernel's code does
    not depend on (the rows of a normalization, the vectors of a pointwise domain): it comes in
    at launch, so one compiled kernel serves every value of it; ``value`` is this plan's."""

    kind: str  # "in" (a tensor read), "out" (a tensor written), "ws" (workspace), "scalar",
    # "extent"
    name: str  # tensor, workspace, scalar or extent name
    ctype: str
    value: int | None = None  # an extent's value at this plan's shapes


def outer_free(extents: Sequence[int]) -> str:
    """A domain as its kernel's comment shows it: the outermost extent, which comes in at
    launch, as ``*`` (a comment with the value would make the source, and so the compiled
    kernel, differ from shape to shape)."""
    return "[" + ", ".join(["*", *map(str, extents[1:])] if extents else []) + "]"


def kept_domain(domain: Sequence[int], kept: Sequence[int], flat: bool) -> str:
    """A row kernel's domain as its comment shows it (``kept``: the axes it keeps; ``flat``:
    they are indexed as one flat row, ``codegen.launch.flat_rows``): the kept extents as one
    ``*`` where the rows are flat and lead (as a [rows, hidden] kernel's), else the outermost
    where it is kept; the values otherwise."""
    if flat and kept[:1] == [0]:  # every kept extent comes in as n_rows, one flat axis
        return str(["*"] + [e for a, e in enumerate(domain) if a not in kept]).replace("'", "")
    return outer_free(domain) if kept[:1] == [0] else str(list(domain))


def extent_param(name: str, value: int, index_type: str) -> KernelParam:
    """The launch argument ``name`` (``n_rows``, ``n_vec``): an extent of ``value`` in this
    plan, of the kernel's index type."""
    return KernelParam("extent", name, "int" if index_type == "int" else "long long", value)


@dataclass
class Kernel:
    name: str
    params: list[KernelParam]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0


@dataclass
class Workspace:
    name: str
    nbytes: int


@dataclass
class SegmentKernels:
    """Everything the runtime needs to run one segment: one CUDA source (the helpers its kernels'
    code calls, then that code), its kernels in launch order, scratch buffers, and which
    tensors must be 16-byte-vector aligned."""

    segment: int
    kind: str
    code: str  # the kernels' code (``kernel_code``); empty where the segment has no kernel
    kernels: list[Kernel]
    workspaces: list[Workspace] = field(default_factory=list)
    vector_aligned: dict[str, int] = field(default_factory=dict)  # tensor -> alignment bytes
    notes: dict[str, object] = field(default_factory=dict)
    uses: frozenset[str] = frozenset()  # every name the code's statements read (helpers too)

    @cached_property
    def source(self) -> str:
        return preamble(self.uses) + "\n" + self.code if self.code else ""


@dataclass
class Reducer:
    """How one reduction op accumulates: accumulator type, identity, combine functor, and the
    values of its outputs from a finished accumulator.

    ``copies``: how many elements of the reduced operand each element the kernel visits stands
    for. A kernel iterates its domain, which has no axis where every tensor of the segment is
    broadcast; an operand broadcast along a reduced axis of extent > 1 (an expanded input, a
    ``broadcast_in_dim`` of the loss gradient) holds one value for all of that axis, and the
    reduction over it counts that value once per element of the axis (torch's sum of an
    expanded tensor). The results scale by it: a sum multiplies, a product raises to the power,
    a variance weighs its squared deviations; a maximum or minimum is the same."""

    op_index: int
    op: Op
    source: str  # the reduced tensor
    acc_type: str
    identity: str
    functor: str
    welford: bool
    value_dtype: DType  # the type values are accumulated in
    calls: frozenset[str] = frozenset()  # the preamble helpers its type and functor spell
    copies: int = 1

    def describe(self) -> str:
        """``T4, T5 = var_mean(T3, dims=[1])``: what the accumulator computes."""
        copies = f" (each value {self.copies} times)" if self.copies > 1 else ""
        return f"{', '.join(self.op.outputs)} = {describe_op(self.op)}{copies}"

    def add(self, acc: Code, x: Code) -> Stmt:
        if self.welford:
            return stmt(f"fc_welford_add({acc}, {x});", "fc_welford_add", acc, x)
        return stmt(f"{acc} = {self.functor}({acc}, {x});", self.calls, acc, x)

    def counted(self, value: str | Code) -> str | Code:
        """A sum over the visited elements as the sum over every element (``copies``)."""
        if self.copies == 1:
            return value
        return cuda.binary("mul", value, cuda.literal(self.copies, self.value_dtype),
                           self.value_dtype)

    def results(self, bound: Bound, acc: Code) -> list[tuple[str, Code]]:
        """(output tensor, its value of its compute type) from a finished accumulator."""
        fusion = bound.fusion
        outs = []
        for k, name in enumerate(self.op.outputs):
            d = fusion.tensors[name].dtype
            if self.welford:  # torch: divisor max(n - correction, 0); empty -> nan
                nan = cuda.literal(float("nan"), self.value_dtype)
                zero = cuda.literal(0, self.value_dtype)
                if k == 0:
                    corr = cuda.literal(self.op.attrs["correction"], self.value_dtype)
                    m2, n = self.counted(f"fc_welford_m2({acc})"), self.counted(f"{acc}.n")
                    raw = f"({m2} / fc_max({n} - {corr}, {zero}))"
                    helpers = ("fc_welford_m2", "fc_max")
                else:
                    raw = f"({acc}.n == {zero} ? {nan} : fc_welford_mean({acc}))"
                    helpers = ("fc_welford_mean",)
                expr = derived(cuda.convert(raw, self.value_dtype, d), acc, helpers)
            elif self.op.name == "sum":
                expr = derived(cuda.convert(self.counted(acc), self.value_dtype, d), acc)
            elif self.op.name == "prod" and self.copies > 1:
                power = cuda.binary("pow", acc, cuda.literal(self.copies, self.value_dtype),
                                    self.value_dtype)
                expr = derived(cuda.convert(power, self.value_dtype, d), acc)
            else:
                expr = derived(cuda.convert(acc, self.value_dtype, d), acc)
            outs.append((name, expr))
        return outs


def copies_per_visit(bound: Bound, op_index: int, domain: Sequence[int],
                     axes: Sequence[int]) -> int:
    """``Reducer.copies`` of reduction ``op_index`` in a kernel that visits the ``axes`` of
    ``domain`` for each result: its operand's elements per result over the visited ones."""
    op = bound.fusion.ops[op_index]
    shape = bound.shapes[op.inputs[0]]
    every = math.prod(shape[a] for a in reduction_axes(op.attrs, len(shape)))
    visited = math.prod(domain[a] for a in axes)
    if every == visited or visited == 0:
        return 1
    if every % visited:
        raise PlanError(f"{describe_op(op)}: the kernel visits {visited} elements of each "
                        f"reduced row of {list(shape)} but the row has {every}")
    return every // visited


def reducer(bound: Bound, op_index: int, copies: int = 1) -> Reducer:
    """The accumulator of reduction ``op_index``; ``copies``: see ``Reducer``."""
    fusion = bound.fusion
    op = fusion.ops[op_index]
    src = op.inputs[0]
    src_dtype = fusion.tensors[src].dtype
    out_dtype = fusion.tensors[op.outputs[0]].dtype
    if op.name in ("var", "var_mean"):
        vt = DType.float64 if src_dtype is DType.float64 else DType.float32
        acc = "fc_welford_d" if vt is DType.float64 else "fc_welford_f"
        zeros = "0, 0, 0" if vt is DType.float64 else "0, 0, 0, 0"
        return Reducer(op_index, op, src, acc, f"{acc}{{{zeros}}}", "fc_welfordop()", True, vt,
                       frozenset({acc, "fc_welfordop"}), copies)
    if op.name in ("sum", "prod"):
        if out_dtype.is_float:
            vt = DType.float64 if DType.float64 in (out_dtype, src_dtype) else DType.float32
        else:
            vt = DType.int64
    else:
        vt = src_dtype.compute if src_dtype.is_float else src_dtype
    ct = cuda.compute(vt)
    if op.name == "sum":
        identity, functor = cuda.literal(0, vt), "fc_add"
    elif op.name == "prod":
        identity, functor = cuda.literal(1, vt), "fc_mul"
    elif op.name == "max":
        identity = cuda.literal(float("-inf"), vt) if vt.is_float else \
            ("(-9223372036854775807LL - 1)" if vt is DType.int64 else "(-2147483647 - 1)")
        if vt.is_bool:
            identity = "false"
        functor = "fc_maxop"
    else:
        identity = cuda.literal(float("inf"), vt) if vt.is_float else \
            ("9223372036854775807LL" if vt is DType.int64 else "2147483647")
        if vt.is_bool:
            identity = "true"
        functor = "fc_minop"
    return Reducer(op_index, op, src, ct, identity, f"{functor}()", False, vt,
                   frozenset({functor}), copies)


def kernel_code(body: list[Stmt]) -> Code:
    """A segment's kernels' code from their statements, without the values nothing reads, and
    every name it reads (its source adds the helpers among them: ``SegmentKernels.source``)."""
    kept = drop_unread(body)
    return Code(text_of(kept) + "\n", frozenset().union(*(s.reads for s in kept)))


def segment_kernels(segment: int, kind: str, body: list[Stmt], kernels: list[Kernel],
                    workspaces: list[Workspace], aligned: dict[str, int],
                    notes: dict[str, object]) -> SegmentKernels:
    """A segment's kernels from their statements: the code ``kernel_code`` keeps, and what it
    reads (the preamble links the helpers among those names)."""
    code = kernel_code(body)
    return SegmentKernels(segment, kind, code.text, kernels, workspaces, aligned, notes,
                          code.reads)


def joined(parts: list[SegmentKernels], notes: dict[str, object]) -> SegmentKernels:
    """One segment's kernels generated apart (each part's kernels already named apart), launched
    in the parts' order: one source, one preamble. A tensor two parts read keeps the larger
    alignment."""
    aligned: dict[str, int] = {}
    for p in parts:
        for t, a in p.vector_aligned.items():
            aligned[t] = max(aligned.get(t, 1), a)
    return SegmentKernels(parts[0].segment, parts[0].kind, "".join(p.code for p in parts),
                          [k for p in parts for k in p.kernels],
                          [w for p in parts for w in p.workspaces], aligned, notes,
                          frozenset().union(*(p.uses for p in parts)))


def signature(name: str, params: list[KernelParam], threads: int, min_blocks: int = 0,
              calls: frozenset[str] = frozenset()) -> Stmt:
    """The kernel's declaration, opening its body; ``min_blocks`` (blocks per SM the registers
    must allow) lets ptxas use up to its share of the register file instead of its own smaller
    default; ``calls``: the preamble types its parameters spell (a workspace's accumulator)."""
    args = ",\n    ".join(f"{p.ctype} {_param_name(p)}" for p in params)
    bounds = f"{threads}, {min_blocks}" if min_blocks else f"{threads}"
    return Stmt(f'extern "C" __global__ void __launch_bounds__({bounds}) {name}(\n    {args})'
                " {", reads=frozenset(calls))


def _param_name(p: KernelParam) -> str:
    return {"in": f"in_{p.name}", "out": f"out_{p.name}", "ws": f"ws_{p.name}",
            "scalar": f"s_{p.name}", "extent": p.name}[p.kind]


def tensor_params(bound: Bound, inputs, outputs, scalars) -> list[KernelParam]:
    fusion = bound.fusion
    params = [KernelParam("in", t, f"const {cuda.storage(fusion.tensors[t].dtype)}* __restrict__")
              for t in inputs]
    params += [KernelParam("out", t, f"{cuda.storage(fusion.tensors[t].dtype)}* __restrict__")
               for t in outputs]
    params += [KernelParam("scalar", s, _scalar_ctype(fusion.scalars[s].dtype)) for s in scalars]
    return params


def _scalar_ctype(d: DType) -> str:
    return "double" if d.is_float else ("bool" if d.is_bool else "long long")
