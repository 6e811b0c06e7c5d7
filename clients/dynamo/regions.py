"""A compiled ATen graph's fusible regions as fusecut definitions.

``fuse_regions`` finds the largest connected groups of nodes the translation table takes
(``aten.translatable``; torch's capability-based proposal, ``dynamo.proposal``, keeps every
group free of cycles),
moves each into a submodule, and replaces that submodule with a ``Region``: fusecut's plan and
kernels through the engine, on the definition ``translate`` wrote from the group's nodes. A group
of views alone stays on ATen (it moves no bytes a kernel could save). Matmuls, attention,
embeddings, random ops and everything else stay on ATen: torch's own kernels (cuBLAS, cuDNN,
Flash).

A region that fails at any stage (translate, plan, codegen, compile, launch) runs its ATen
submodule from then on, said once in a warning and in its report: the step never breaks.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from fusecut.definition import FusionDefinition
from fusecut.dynamo.aten import COMPARING, EMITTERS, ROUNDING, VIEWS, translatable
from fusecut.dynamo.proposal import propose_partitions
from fusecut.fronts import RegionFailure, RegionReport, stage
from fusecut.optimizer.ir.dtypes import DType
from fusecut.plan import PlanView
from fusecut.runtime.memory_order import inverse, memory_order
from fusecut.runtime.tensors import from_torch_dtype

log = logging.getLogger("fusecut.dynamo")

_regions: list[weakref.ref] = []  # every Region made in this process, for region_reports()
_regions_lock = threading.Lock()
_serials = itertools.count()


def fuse_regions(gm: GraphModule, direction: str,
                 emulate_precision_casts: bool = False) -> list[Region]:
    """Replace ``gm``'s fusible groups with Regions (in place); the Regions made (computing as
    ``translate`` says for ``emulate_precision_casts``)."""
    partitions = _merged([p for proposed in propose_partitions(gm, translatable)
                          for p in _components(_without_outer_views(proposed))])
    partitions = [p for p in partitions
                  if any(n.target not in VIEWS for n in p.nodes) and _reads_a_tensor(p)]
    if not partitions:
        return []
    fused = fuse_by_partitions(gm, [p.nodes for p in partitions], prefix="fused_")
    regions = []
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        sub = getattr(fused, node.target)
        region = Region(f"{direction}_{len(regions)}", direction, sub, emulate_precision_casts)
        setattr(fused, node.target, region)
        regions.append(region)
    fused.recompile()
    gm.graph = fused.graph
    for name, module in fused.named_children():
        gm.add_submodule(name, module)
    gm.recompile()
    with _regions_lock:
        _regions.extend(weakref.ref(r) for r in regions)
    return regions


def _components(partition) -> list:
    """``partition`` split into the groups that share nothing: neither a value computed in it
    nor an input read from outside it. Torch's partitioner puts unrelated groups in one
    partition, and a fused module runs where its last node was: the bias and LayerNorm
    gradients' column sums of every layer became one region at the end of GPT-2's backward,
    which held each layer's output gradient alive until then. Groups that read the same input
    stay together (their reductions can share the read)."""
    from torch.fx.passes.infra.partitioner import Partition

    nodes = list(partition.nodes)
    parent = {n: n for n in nodes}

    def root(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    readers: dict[Node, Node] = {}  # an outside input -> a node reading it
    for node in nodes:
        for a in node.all_input_nodes:
            other = a if a in parent else readers.setdefault(a, node)
            parent[root(node)] = root(other)
    groups: dict[Node, list[Node]] = {}
    for node in nodes:
        groups.setdefault(root(node), []).append(node)
    if len(groups) == 1:
        return [partition]
    return [Partition(id=partition.id * 1000 + k, nodes=group)
            for k, group in enumerate(groups.values())]


def _merged(partitions: list) -> list:
    """Partitions joined where one reads a value the other computes and no path between them
    runs outside both (joined, they would wait on each other). Torch's partitioner kept the
    LayerNorm gradient's statistics apart from its weight gradient's column sums (those sat in
    one partition with every other layer's, which a matmul between them split off); once the
    column sums are groups of their own, each joins the region its values come from, and the
    float32 values between them are never written."""
    owner = {n: k for k, p in enumerate(partitions) for n in p.nodes}
    groups = {k: set(p.nodes) for k, p in enumerate(partitions)}
    changed = True
    while changed:
        changed = False
        for k in sorted(groups):
            if k not in groups:
                continue
            readers = sorted({owner[u] for n in groups[k] for u in n.users
                              if u in owner and owner[u] != k})
            for j in readers:
                if j in groups and not _path_outside(groups[k], groups[j]):
                    groups[k] |= groups.pop(j)
                    for n in groups[k]:
                        owner[n] = k
                    changed = True
    if len(groups) == len(partitions):
        return partitions
    from torch.fx.passes.infra.partitioner import Partition

    return [Partition(id=partitions[k].id, nodes=[n for p in partitions for n in p.nodes
                                                  if n in nodes])
            for k, nodes in sorted(groups.items())]


def _path_outside(first: set, second: set) -> bool:
    """Whether a path from ``first`` leaves both sets and comes back into either."""
    both = first | second
    seen: set = set()
    stack = [u for n in both for u in n.users if u not in both]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for u in node.users:
            if u in both:
                return True
            stack.append(u)
    return False


def _reads_a_tensor(partition) -> bool:
    """Whether the group reads a tensor made outside it: a group of factories alone (a
    ``full``, a ``scalar_tensor``) has no argument to say which device its kernel runs on."""
    return any(isinstance(a.meta.get("val"), torch.Tensor) for n in partition.nodes
               for a in n.all_input_nodes if a not in partition.nodes)


def _without_outer_views(partition):
    """``partition`` less the views whose every user is outside it, and those whose every input
    is: ATen makes them (a view moves no bytes). A trailing view from the region's output, with
    the strides the trace gave it (an ``expand``'s stride-0 axes, which a kernel's dense output
    cannot have): a region never writes bytes a view only re-reads. A leading view of an input
    hands the region the input in the shape it computes in: a reshape inside it would stand
    between an input and a reduction, which a reduction's kernel cannot take."""
    changed = True
    while changed:
        changed = False
        for node in list(partition.nodes):
            if node.target not in VIEWS:
                continue
            trailing = node.users and not any(user in partition.nodes for user in node.users)
            leading = not any(a in partition.nodes for a in node.all_input_nodes)
            if trailing or leading:
                partition.remove_node(node)
                changed = True
    return partition


@dataclass(frozen=True)
class Translated:
    """A region's definition for one layout (and, under ``dynamic=True``, one shape) of its
    arguments."""

    definition: FusionDefinition
    ops: list[str]
    taken: list[int]  # the arguments the definition takes (its tensors), by position
    outputs: list[tuple[str, int]]  # per output: ("out", k) the definition's, ("in", i) arg i
    strides: list[tuple[int, ...] | None]  # per output, ATen's strides where dense
    views: list[tuple[int, ...] | None]  # per definition output, the permute that views it back


def translate(sub: GraphModule, args: list[Any],
              emulate_precision_casts: bool = False) -> Translated:
    """The definition computing ``sub``'s outputs from its placeholders, for arguments like
    ``args``: tensors become inputs laid out as they are; integers (sizes, under
    ``dynamic=True``) are taken at their values.

    A 16-bit float value computed inside the region stays a float32 one, as in Inductor's
    kernels (its ``emulate_precision_casts`` off, the default): only the region's outputs, the
    graph's own casts to 16 bits and the values whose rounding can be seen (``_rounding_seen``)
    round. Rounding each op's result as eager does costs a conversion an op (GPT-2's tanh-GELU:
    58 us a call against 27 on the H200) and is less accurate. ``emulate_precision_casts``
    rounds every op's result to its ATen dtype, as eager."""
    seen = set() if emulate_precision_casts else _rounding_seen(sub)
    fd = FusionDefinition()
    widened: dict[Node, Any] = {}  # a 16-bit float value, read as float32 (computed once)
    env: dict[Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    ops, taken = [], []
    with fd:
        for k, (p, arg) in enumerate(zip(placeholders, args)):
            if isinstance(arg, torch.Tensor):
                env[p] = fd.from_pytorch(arg)
                taken.append(k)
            else:
                env[p] = arg

        def value(x: Any) -> Any:
            if isinstance(x, Node):
                node, x = x, env[x]
                dtype = getattr(x, "dtype", None)
                if not emulate_precision_casts and dtype is not None and dtype.is_half:
                    if node not in widened:
                        widened[node] = fd.ops.cast(x, DType.float32)
                    x = widened[node]
            if isinstance(x, (bool, int, float)):
                return fd.define_scalar(x)
            return x

        for node in sub.graph.nodes:
            if node.op != "call_function":
                continue
            results = EMITTERS[node.target](fd.ops, value, _Concrete(node, env))
            vals = node.meta["val"]
            vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
            keep = emulate_precision_casts or node.target in ROUNDING or node in seen
            env[node] = _typed(fd, results, vals, keep)
            ops.append(getattr(node.target, "__name__", str(node.target)))
        outs = _outputs(sub)
        spec: list[tuple[str, int]] = []
        views: list[tuple[int, ...] | None] = []
        for o in outs:
            if o in placeholders:
                spec.append(("in", placeholders.index(o)))
                continue
            # a permuted layout is written row-major in its memory order (the permute is in
            # the kernel's indexing) and handed back as the permuted view of it
            order = memory_order(o.meta["val"])
            out = _as_dtype(fd, env[o], from_torch_dtype(o.meta["val"].dtype))
            fd.add_output(out if order is None else fd.ops.permute(out, list(order)))
            spec.append(("out", len(views)))
            views.append(None if order is None else inverse(order))
    strides = [tuple(o.meta["val"].stride()) if _dense(o.meta["val"]) else None for o in outs]
    return Translated(fd, ops, taken, spec, strides, views)


def _rounding_seen(sub: GraphModule) -> set[Node]:
    """The nodes whose 16-bit rounding can be seen, kept where the region computes in float32
    (as the Thunder executor keeps a round trip's, ``fusecut.thunder.layout``): one a value
    computed from it is compared by (``aten.COMPARING``; a max's backward finds the maximum by
    ``eq`` against the forward's saved, rounded result: unrounded, it matches nothing), one that
    reaches an output wider than 16 bits, and an output itself."""
    outputs = set(_outputs(sub))
    below: dict[Node, bool] = {}  # a value computed from the node is compared or leaves wide
    for node in reversed(sub.graph.nodes):
        below[node] = any(
            user.target in COMPARING or below.get(user, False)
            or (user in outputs and _wide_float(user.meta.get("val")))
            for user in node.users)
    return {n for n in sub.graph.nodes if n in outputs or below[n]}


def _wide_float(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point and \
        val.dtype.itemsize > 2


def _outputs(sub: GraphModule) -> list[Any]:
    outs = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]


class _Concrete:
    """A node as an emitter reads it, with its integer arguments (symbolic sizes under
    ``dynamic=True``, graph inputs of the region) at this call's values."""

    def __init__(self, node: Node, env: dict[Node, Any]):
        def concrete(a: Any) -> Any:
            if isinstance(a, Node) and isinstance(env.get(a), int):
                return env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(concrete(x) for x in a)
            return a

        self.target, self.meta = node.target, node.meta
        self.args = tuple(concrete(a) for a in node.args)
        self.kwargs = {k: concrete(v) for k, v in node.kwargs.items()}


def _propagate(sub: GraphModule, args: list[Any]) -> None:
    """Every node's ``meta["val"]`` at these arguments' shapes (fake tensors): under
    ``dynamic=True`` the trace's are symbolic, and a definition is written at concrete ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(sub, mode).propagate_dont_convert_inputs(*fakes)


def _dense(val: torch.Tensor) -> bool:
    """A traced output that covers its memory without gaps or overlaps, row-major or permuted:
    what comes after the region (a ``view``, an attention's backward) saw those strides in the
    trace, so the region hands them back. A slice's or an expand's are left as they come."""
    return val.is_contiguous() or memory_order(val) is not None


def _symbolic(val: Any) -> bool:
    if isinstance(val, (tuple, list)):
        return any(map(_symbolic, val))
    if isinstance(val, torch.SymInt):
        return True
    return isinstance(val, torch.Tensor) and any(isinstance(e, torch.SymInt) for e in val.shape)


def _strided(result: torch.Tensor, strides: tuple[int, ...] | None) -> torch.Tensor:
    """``result`` with the strides the trace gave it. The definition asks for its memory order,
    but a value fusecut sees as a broadcast comes out expanded (stride 0), and code after the
    region may ``view`` it as the trace's dense layout: then it is copied into that layout."""
    if strides is None or all(s == t or e == 1 for s, t, e in
                              zip(result.stride(), strides, result.shape)):
        return result
    return torch.empty_strided(result.shape, strides, dtype=result.dtype,
                               device=result.device).copy_(result)


def _typed(fd: FusionDefinition, results: list[Any], vals: list[Any], keep_16_bit: bool) -> Any:
    """Results cast to ATen's dtypes, but for a 16-bit float one left in float32 unless
    ``keep_16_bit`` (``translate`` says why); one handle, or a tuple for a multi-output op."""
    typed = []
    for handle, val in zip(results, vals):
        want = from_torch_dtype(val.dtype)
        if want.is_half and not keep_16_bit:
            want = DType.float32
        typed.append(_as_dtype(fd, handle, want))
    return typed[0] if len(vals) == 1 else tuple(typed)


def _as_dtype(fd: FusionDefinition, handle: Any, dtype: DType) -> Any:
    return fd.ops.cast(handle, dtype) if handle.dtype != dtype else handle


class Region(torch.nn.Module):
    """One fusible group of a compiled graph: fusecut's plan and kernels, or, once any stage
    failed, the group's ATen submodule.

    Its definition is written from the first call's arguments, one per layout of them (their
    strides: the trace's are a guess for values other compiled code made); each goes through the
    engine, so every region of the same definition shares plans and kernels."""

    def __init__(self, name: str, direction: str, aten_module: GraphModule,
                 emulate_precision_casts: bool = False):
        super().__init__()
        self.emulate_precision_casts = emulate_precision_casts
        self.serial = next(_serials)  # the order regions were made in this process
        self.name = name
        self.direction = direction
        self.aten_module = aten_module
        self.calls = 0
        self.fallback_reason: str | None = None
        self.fallback_stage: str | None = None
        self.setup_seconds: dict[str, float] = {}
        self.ops: list[str] = [getattr(n.target, "__name__", str(n.target))
                               for n in aten_module.graph.nodes if n.op == "call_function"]
        self.definition: FusionDefinition | None = None  # the first call's
        self.first_args: list[Any] | None = None
        self.variants: dict[tuple, Translated] = {}  # per layout (and shape) of the arguments
        self._single = not isinstance(
            next(n for n in aten_module.graph.nodes if n.op == "output").args[0], (tuple, list))
        # under dynamic=True the trace's shapes are symbolic: one definition per shape
        self.symbolic = any(_symbolic(n.meta.get("val")) for n in aten_module.graph.nodes)

    def forward(self, *args: Any) -> Any:
        self.calls += 1
        if self.fallback_reason is None:
            try:
                outs = self._run(list(args))
            except RegionFailure as failure:  # never the user's step: this region runs on ATen
                self._give_up(failure)
            else:
                return outs[0] if self._single else tuple(outs)
        return self.aten_module(*args)

    def variant(self, args: list[Any]) -> Translated:
        """The definition for arguments like ``args`` (written on first sight of their layout)."""
        if self.symbolic:
            key = tuple((a.shape, a.stride()) if isinstance(a, torch.Tensor) else a
                        for a in args)
        else:
            key = tuple(a.stride() if isinstance(a, torch.Tensor) else type(a) for a in args)
        variant = self.variants.get(key)
        if variant is None:
            with stage("translate", self.setup_seconds):
                if self.symbolic:
                    _propagate(self.aten_module, args)
                variant = self.variants[key] = translate(self.aten_module, args,
                                                         self.emulate_precision_casts)
            self.ops = variant.ops
            if self.definition is None:
                from fusecut.engine import as_metadata

                self.definition = variant.definition
                self.first_args = as_metadata([args[k] for k in variant.taken])
        return variant

    def _run(self, args: list[Any]) -> list[Any]:
        variant = self.variant(args)
        definition = variant.definition
        inputs = [args[k] for k in variant.taken]
        handle = definition.handle
        warm = handle.warm  # a compiled program for arguments like these: one signature check
        results = None
        if warm is not None:
            with stage("launch"):
                results = warm(inputs)
        if results is None:  # each stage on its own, so that a failure says where
            with stage("plan", self.setup_seconds):
                handle.execution_plan(inputs)
            if any(a.is_cuda for a in inputs):
                with stage("codegen", self.setup_seconds):
                    handle.program(inputs)
            with stage("launch"):
                results = definition.execute(inputs)
        results = [r if view is None else r.permute(view)
                   for r, view in zip(results, variant.views)]
        return [args[i] if kind == "in" else _strided(results[i], strides)
                for (kind, i), strides in zip(variant.outputs, variant.strides)]

    def _give_up(self, failure: RegionFailure) -> None:
        if self.fallback_reason is not None:
            return
        self.fallback_stage = failure.stage
        self.fallback_reason = str(failure)
        log.warning("fusecut region %s runs on ATen from now on: %s", self.name, failure)

    def report(self) -> RegionReport:
        text = repr(self.definition) if self.definition is not None else ""
        report = RegionReport(self.name, self.direction, list(self.ops), text, self.calls,
                              fallback=self.fallback_reason,
                              fallback_stage=self.fallback_stage,
                              setup_seconds=dict(self.setup_seconds))
        if self.fallback_reason is None and self.first_args is not None:
            report.add_plan(PlanView(plan=self.definition.handle.execution_plan(self.first_args)))
        return report


def live_regions() -> list[Region]:
    """Every Region made in this process and still alive (its compiled graph is), in the order
    they were made."""
    with _regions_lock:
        alive = [r() for r in _regions]
        _regions[:] = [ref for ref, r in zip(_regions, alive) if r is not None]
    return [r for r in alive if r is not None]


def region_reports() -> list[RegionReport]:
    """The report of every region compiled in this process (and still alive), forward,
    backward and inference, in the order they were made."""
    return [r.report() for r in live_regions()]
