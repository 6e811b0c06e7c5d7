"""Rewrites of an ATen graph before its regions are cut: common subexpressions merged, gathers
sunk through pointwise ops, views hoisted above casts.

A model computes the same value in many places: Hugging Face's attention writes the causal mask
as ``where(mask, 0, -inf)`` once per layer, twelve identical ``[batch, 1, seq, seq]`` tensors in
GPT-2 small, each of which a region would write and the code after it copy. Inductor's
partitioner merges them (AOTAutograd's ``fx_graph_cse``); fusecut's partitioner merges them in
the joint graph, and ``compile_graph`` in an inference graph (which no partitioner sees), with
the same pass: random draws, and values that alias a graph output, are kept apart.

A cross-entropy decomposes into ``gather(log_softmax(x), 1, target)``: the log-probabilities of
every class, computed for the one per row that is picked. In a region that is still a
``(rows, classes)`` float32 value between the softmax's reductions and the pick, which fusecut
writes to memory and reads back (the pick reads it where the index says). But a pick commutes
with pointwise ops: ``gather(x - m - log(s), 1, t) == gather(x, 1, t) - m - log(s)`` where ``m``
and ``s`` have one value per row. So each gather of a pointwise op becomes the op on gathers
of its full operands (operands of extent 1 along the gathered axis are taken as they are), down
to values that are not pointwise; the full log-probabilities then have no reader, and are gone.

A ``view`` of a cast (``logits.float().view(-1, classes)``, as Hugging Face's losses write it)
is the cast of a view: hoisted, the view reaches the region's input and is left to ATen (a view
of an input moves no bytes), and the region's definition reads the input in the shape its
reductions use. Left in the region, the reshape sits between the cast and the softmax's
reductions, which a reduction's kernel cannot take: the float32 cast is written whole and read
back (five times the loss's floor, measured on GPT-2's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from fusecut.dynamo.aten import VIEWS, is_plain_cast, translatable

aten = torch.ops.aten
prims = torch.ops.prims

# ops whose every element depends on the same element of each operand (the rest: scalars)
POINTWISE = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
             aten.neg.default, aten.exp.default, aten.log.default,
             aten._to_copy.default, prims.convert_element_type.default}


def merge_common_subexpressions(gm: GraphModule) -> int:
    """Merge ``gm``'s identical computations (in place), unless torch's AOTAutograd config turns
    its CSE off; how many nodes were merged."""
    from torch._functorch import config
    from torch._functorch.compile_utils import fx_graph_cse

    if not config.cse:
        return 0
    before = len(gm.graph.nodes)
    gm.graph = fx_graph_cse(gm.graph)
    gm.recompile()
    return before - len(gm.graph.nodes)


def sink_gathers(gm: GraphModule) -> int:
    """Rewrite ``gm``'s gathers of pointwise ops (in place); how many were rewritten."""
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.gather.default \
                or node.kwargs.get("sparse_grad") or len(node.args) != 3:
            continue
        source, dim, index = node.args
        if not (isinstance(source, Node) and source.target in POINTWISE) or _symbolic(node):
            continue
        with graph.inserting_before(node):
            sunk = _gathered(graph, source, dim % source.meta["val"].dim(), index)
        if sunk is None:
            continue
        node.replace_all_uses_with(sunk)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        gm.recompile()
    return rewritten


# views that only reshape (no reorder, no broadcast)
SHAPE_VIEWS = {aten.view.default, aten._unsafe_view.default}


def hoist_views(gm: GraphModule) -> int:
    """Move ``gm``'s shape views past the casts beside them, toward a region's edge (in place):
    a view of a cast of a value no region computes (an input, a matmul's output) becomes a cast
    of its view; a cast of a view, which only values no region computes read, becomes the view
    of a cast. Only where the viewed value is contiguous (so that the moved view is one) and
    the value between has no other reader. How many were moved."""
    graph = gm.graph
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in SHAPE_VIEWS or _symbolic(node):
            continue
        source = node.args[0]
        if not isinstance(source, Node) or len(source.users) != 1:
            continue
        view = node
        if is_plain_cast(source) and _movable(source.args[0]) \
                and not _computes(source.args[0]) and any(map(_computes, view.users)):
            cast = source
            inner, outer = cast, view  # view(cast(x)) -> cast(view(x))
            with graph.inserting_before(outer):
                first = _node(graph, view.target, (cast.args[0], *view.args[1:]),
                              dict(view.kwargs))
                second = _node(graph, cast.target, (first, *cast.args[1:]), dict(cast.kwargs))
        elif len(view.users) == 1 and is_plain_cast(cast := next(iter(view.users))) \
                and _movable(source) and _computes(source) \
                and not any(map(_computes, cast.users)):
            inner, outer = view, cast  # cast(view(y)) -> view(cast(y))
            with graph.inserting_before(outer):
                first = _node(graph, cast.target, (source, *cast.args[1:]), dict(cast.kwargs))
                second = _node(graph, view.target, (first, *view.args[1:]), dict(view.kwargs))
        else:
            continue
        outer.replace_all_uses_with(second)
        graph.erase_node(outer)
        graph.erase_node(inner)
        moved += 1
    if moved:
        gm.recompile()
    return moved


def _computes(node: Node) -> bool:
    """Whether a region would compute ``node`` (a view it leaves to ATen at its edges)."""
    return translatable(node) and node.target not in VIEWS


def _movable(value: Any) -> bool:
    val = value.meta.get("val") if isinstance(value, Node) else None
    return isinstance(val, torch.Tensor) and not _symbolic(value) and val.is_contiguous()


def _symbolic(node: Node) -> bool:
    """Sizes that are symbols (``dynamic=True``): left as they are."""
    val = node.meta.get("val")
    return not isinstance(val, torch.Tensor) or any(
        not isinstance(e, int) for e in (*val.shape, *val.stride()))


def _gathered(graph: Graph, value: Node, dim: int, index: Node) -> Node | None:
    """A node computing ``gather(value, dim, index)``, the gather sunk below pointwise ops;
    None where an operand's shape does not allow it."""
    if _symbolic(value):
        return None
    val, picked = value.meta["val"], index.meta["val"]
    if val.dim() == 0:
        return value  # a 0-d operand broadcasts to the gathered shape as it did to the full one
    if val.dim() != picked.dim():
        return None
    if val.shape[dim] == 1 and picked.shape[dim] == 1 and _spans(val, picked, dim):
        return value  # one value along the axis: every pick is it
    if val.shape != _full_shape(picked, val, dim):
        return None
    if value.target not in POINTWISE:
        return _node(graph, aten.gather.default, (value, dim, index), {})
    args = []
    for a in value.args:
        if isinstance(a, Node) and isinstance(a.meta.get("val"), torch.Tensor):
            a = _gathered(graph, a, dim, index)
            if a is None:
                return None
        args.append(a)
    return _node(graph, value.target, tuple(args), dict(value.kwargs))


def _spans(val: torch.Tensor, picked: torch.Tensor, dim: int) -> bool:
    return all(a == b for i, (a, b) in enumerate(zip(val.shape, picked.shape)) if i != dim)


def _full_shape(picked: torch.Tensor, val: torch.Tensor, dim: int) -> torch.Size:
    """The shape a value gathered from must have: the index's, with the value's extent along
    the axis (other axes must match: a broadcast operand bails out)."""
    return torch.Size(val.shape[i] if i == dim else picked.shape[i] for i in range(picked.dim()))


def _node(graph: Graph, target: Any, args: tuple, kwargs: dict) -> Node:
    """A new node with its ``meta["val"]``: a fake tensor of the shape, strides, dtype and device
    the op gives (the graph's own fake tensors can come from several fake modes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    node = graph.call_function(target, args, kwargs)
    with FakeTensorMode():
        def fake(a: Any) -> Any:
            if not isinstance(a, Node):
                return a
            t = a.meta["val"]
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

        node.meta["val"] = target(*map(fake, args), **kwargs)
    return node
