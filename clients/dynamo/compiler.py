"""The backend: AOTAutograd with fusecut's decompositions, partitioner and graph compiler.

``compile_graph`` takes one graph AOTAutograd made (forward, backward or inference), replaces
its fusible regions with fusecut Regions (``regions.fuse_regions``) and returns it to run as it
is: every node that is not in a region runs on ATen, as eager would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx import GraphModule

from fusecut.dynamo.regions import fuse_regions
from fusecut.dynamo.rewrite import sink_gathers

aten = torch.ops.aten

# what AOTAutograd decomposes before fusecut sees a graph: the core ATen set, and the composite
# normalizations and activations it keeps whole (so that their parts fuse with their
# neighbours). Attention is not decomposed: it runs on torch's fused kernels (cuDNN, Flash, the
# CPU's flash kernel), which also never hold the scores in memory (and the core set's math form
# of the CPU kernel gave Llama's attention wrong gradients, measured on torch 2.13).
DECOMPOSITIONS = {op: fn for op, fn in core_aten_decompositions().items()
                  if "scaled_dot_product" not in str(op)} | {**get_decompositions([
    aten.gelu, aten.gelu_backward, aten.native_layer_norm, aten.native_layer_norm_backward,
    aten._softmax, aten._log_softmax, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.silu, aten.silu_backward, aten.sigmoid_backward,
    aten.tanh_backward, aten.threshold_backward, aten.native_group_norm, aten.mse_loss,
])}


@dataclass(frozen=True)
class Options:
    """What ``backend(...)`` takes.

    partitioner: "fusecut" (fusecut's byte model decides what the forward saves and what the
    backward recomputes) or "min_cut" (Inductor's min-cut rematerialization partitioner, the
    anchor), or "default" (save everything the backward uses).
    """

    partitioner: str = "fusecut"

    def __post_init__(self):
        if self.partitioner not in ("fusecut", "min_cut", "default"):
            raise ValueError(f"fusecut backend: partitioner must be 'fusecut', 'min_cut' or "
                             f"'default', got {self.partitioner!r}")


def compile_graph(direction: str, gm: GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """One AOTAutograd graph with its fusible regions on fusecut."""
    sink_gathers(gm)
    fuse_regions(gm, direction)
    return make_boxed_func(gm.forward)


def _partition_fn(options: Options) -> Callable:
    from torch._functorch.partitioners import (
        default_partition,
        min_cut_rematerialization_partition,
    )

    from fusecut.dynamo.partition import fusecut_partition, reported

    chosen = {"default": default_partition, "fusecut": fusecut_partition,
              "min_cut": functools.partial(min_cut_rematerialization_partition,
                                           compiler="inductor")}[options.partitioner]
    return reported(options.partitioner, chosen)


def backend(**options: Any) -> Callable:
    """A torch.compile backend with these options: ``torch.compile(model,
    backend=fusecut.dynamo.backend(partitioner="min_cut"))``."""
    opts = Options(**options)
    return aot_autograd(
        fw_compiler=functools.partial(compile_graph, "forward"),
        bw_compiler=functools.partial(compile_graph, "backward"),
        inference_compiler=functools.partial(compile_graph, "inference"),
        partition_fn=_partition_fn(opts),
        decompositions=DECOMPOSITIONS,
        keep_inference_input_mutations=True,
    )


def fusecut_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """``backend="fusecut"``: the backend with its default options."""
    return backend()(gm, example_inputs)
