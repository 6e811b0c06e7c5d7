"""fusecut's partitioner of AOTAutograd's joint graph: which forward values the forward saves for
the backward, and which the backward recomputes.

The idea is fusecut's byte model applied across the forward/backward boundary, solved as a
minimum cut (as Inductor's min-cut partitioner solves its own weights):

- a value the forward saves costs its bytes twice: written by the forward, read by the
  backward; a forward input (a primal: a parameter, the batch) is already in memory and costs
  its bytes once, read by the backward;
- a value the backward recomputes costs nothing more: it is computed inside one of the
  backward's fusecut regions from values it reads anyway. Only what fusecut can put in a region
  may be recomputed (``aten.translatable``: pointwise ops, casts, reductions, views); a matmul,
  an attention, a random draw stays in the forward, and is saved if the backward needs it.

In the flow network every forward value ``v`` is an edge ``v_in -> v_out`` whose capacity is
its saving cost; its data edges are uncuttable; the source feeds every value that must be
computed in the forward (primals and what cannot be recomputed), and every value a backward op
reads drains to the sink. A minimum cut is the cheapest set of saved values from which the
backward can recompute the rest. The choice is handed to AOTAutograd's default partitioner as
activation-checkpointing tags (save / recompute), which builds the two graphs.

Graphs this does not cover (symbolic shapes, ops with side effects) go to Inductor's min-cut
partitioner, said once in the log.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch.fx import GraphModule, Node

from fusecut.dynamo.aten import translatable
from fusecut.dynamo.rewrite import merge_common_subexpressions

log = logging.getLogger("fusecut.dynamo")

SOURCE, SINK = "__source__", "__sink__"


def _is_tangent(node: Node) -> bool:
    return node.op == "placeholder" and "tangent" in node.name


def _is_primal(node: Node) -> bool:
    """A forward input, or a constant the graph holds: in memory before the forward runs."""
    return (node.op == "placeholder" and not _is_tangent(node)) or node.op == "get_attr"


def _bytes(val: Any) -> int | None:
    """A plain tensor's bytes; None for anything else (a tuple, a symbolic size)."""
    if isinstance(val, torch.Tensor) and all(isinstance(e, int) for e in val.shape):
        return val.numel() * val.element_size()
    return None


def backward_nodes(graph: torch.fx.Graph) -> set[Node]:
    """The nodes that depend on a tangent: the backward."""
    found: set[Node] = set()
    for node in graph.nodes:
        if _is_tangent(node) or any(a in found for a in node.all_input_nodes):
            found.add(node)
    return found


def choose_saved(graph: torch.fx.Graph) -> tuple[list[Node], list[Node]] | None:
    """(saved values, recomputed values) of the minimum cut, or None where the graph has what
    the model does not cover."""
    backward = backward_nodes(graph)
    forward = [n for n in graph.nodes if n not in backward and n.op != "output"]
    flow = nx.DiGraph()
    for node in forward:
        val = node.meta.get("val")
        if node.op not in ("placeholder", "get_attr", "call_function"):
            return None
        if any(isinstance(v, torch.SymInt) for v in _flat(val)):
            return None  # symbolic sizes: the min-cut partitioner handles them
        if node.op == "call_function" and _has_side_effects(node):
            return None
        size = _bytes(val)
        capacity = math.inf if size is None else size * (1 if _is_primal(node) else 2)
        flow.add_edge(f"{node.name}_in", f"{node.name}_out", capacity=capacity)
        if _is_primal(node) or (node.op == "call_function" and not translatable(node)):
            flow.add_edge(SOURCE, f"{node.name}_in", capacity=math.inf)
        for arg in node.all_input_nodes:
            flow.add_edge(f"{arg.name}_out", f"{node.name}_in", capacity=math.inf)
        if any(user in backward for user in node.users):
            flow.add_edge(f"{node.name}_out", SINK, capacity=math.inf)
    if SINK not in flow or SOURCE not in flow:
        return [], []
    try:
        _, (reachable, _) = nx.minimum_cut(flow, SOURCE, SINK)
    except nx.NetworkXUnbounded:
        return None
    saved = [n for n in forward if f"{n.name}_in" in reachable
             and f"{n.name}_out" not in reachable]
    recomputed = [n for n in forward if f"{n.name}_in" not in reachable
                  and n.op == "call_function"]
    return saved, recomputed


def _flat(val: Any) -> list[Any]:
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _has_side_effects(node: Node) -> bool:
    """An op that mutates or communicates (random draws are not side effects here: they are
    never recomputed, so each is drawn once)."""
    try:
        return node.is_impure(impure_random=False)
    except TypeError:  # a torch whose is_impure has no impure_random
        schema = getattr(node.target, "_schema", None)
        return bool(schema is not None and schema.is_mutable)


def fusecut_partition(joint_module: GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                      **kwargs: Any) -> tuple[GraphModule, GraphModule]:
    """AOTAutograd's ``partition_fn``: the forward and backward graphs of fusecut's cut."""
    from torch._functorch.partitioners import (
        default_partition,
        min_cut_rematerialization_partition,
    )
    from torch.utils.checkpoint import CheckpointPolicy

    # as Inductor's partitioner does: one of each value to save or recompute (twelve identical
    # attention masks in GPT-2 small are one)
    merge_common_subexpressions(joint_module)
    choice = choose_saved(joint_module.graph)
    if choice is None:
        log.info("fusecut partitioner: a graph with symbolic sizes or side effects goes to "
                 "the min-cut partitioner")
        return min_cut_rematerialization_partition(joint_module, joint_inputs,
                                                   num_fwd_outputs=num_fwd_outputs, **kwargs)
    saved, recomputed = choice
    for node in recomputed:
        node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
    for node in saved:
        if node.op == "call_function":
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return default_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                             **kwargs)


@dataclass(frozen=True)
class PartitionReport:
    """What one partition of a joint graph saves for the backward."""

    partitioner: str  # "fusecut", "min_cut" or "default"
    saved: int  # tensors the forward hands the backward
    saved_bytes: int
    recomputed: int  # forward ops the backward computes again


_reports: list[PartitionReport] = []
_reports_lock = threading.Lock()


def partition_reports() -> list[PartitionReport]:
    """Every partition made in this process, in order."""
    with _reports_lock:
        return list(_reports)


def reported(name: str, partition: Callable) -> Callable:
    """``partition`` (a ``partition_fn``) that also reports what its forward saves."""
    def partition_and_report(joint_module: GraphModule, joint_inputs: Any, *,
                             num_fwd_outputs: int, **kwargs: Any):
        fw, bw = partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                           **kwargs)
        out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        saved = [n for n in out[num_fwd_outputs:] if isinstance(n, Node)
                 and _bytes(n.meta.get("val")) is not None]
        # an op the backward computes again keeps its joint-graph name in both graphs
        forward_ops = {n.name for n in fw.graph.nodes if n.op == "call_function"}
        again = sum(1 for n in bw.graph.nodes if n.op == "call_function"
                    and n.name in forward_ops)
        report = PartitionReport(name, len(saved), sum(_bytes(n.meta["val"]) for n in saved),
                                 again)
        with _reports_lock:
            _reports.append(report)
        return fw, bw
    return partition_and_report

