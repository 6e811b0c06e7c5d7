"""The backend: AOTAutograd with fusecut's decompositions, partitioner and graph compiler.

``compile_graph`` takes one graph AOTAutograd made (forward, backward or inference), replaces
its fusible regions with fusecut Regions (``regions.fuse_regions``) and returns it to run as it
is (or recorded as a CUDA graph, ``cuda_graphs``): every node that is not in a region runs on
ATen, as eager would.
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

from fusecut.dynamo.compile_ahead import compile_region_ahead
from fusecut.dynamo.cuda_graphs import GraphTree, record_backward, record_forward
from fusecut.dynamo.regions import fuse_regions
from fusecut.dynamo.rewrite import hoist_views, merge_common_subexpressions, sink_gathers

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
    cuda_graphs: each compiled graph recorded as a CUDA graph and replayed
    (``dynamo.cuda_graphs``), as torch.compile's ``mode="reduce-overhead"``.
    emulate_precision_casts: round every 16-bit float op's result inside a region, as eager
    does, instead of computing a region in float32 and rounding its outputs (Inductor's option
    of the same name and default; ``regions.translate``).
    """

    partitioner: str = "fusecut"
    cuda_graphs: bool = False
    emulate_precision_casts: bool = False

    def __post_init__(self):
        if self.partitioner not in ("fusecut", "min_cut", "default"):
            raise ValueError(f"fusecut backend: partitioner must be 'fusecut', 'min_cut' or "
                             f"'default', got {self.partitioner!r}")
        for name in ("cuda_graphs", "emulate_precision_casts"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"fusecut backend: {name} must be True or False, got "
                                 f"{getattr(self, name)!r}")


# torch.compile's modes, as this backend's options
MODES = {"default": {}, "reduce-overhead": {"cuda_graphs": True},
         "max-autotune-no-cudagraphs": {}, "max-autotune": {"cuda_graphs": True}}


def compile_graph(direction: str, gm: GraphModule, example_inputs: Sequence[Any],
                  tree: GraphTree | None = None, emulate_precision_casts: bool = False
                  ) -> Callable:
    """One AOTAutograd graph with its fusible regions on fusecut; recorded as a CUDA graph when
    ``tree`` (the Dynamo graph's, shared by its forward and backward) is given."""
    if direction == "inference":  # a training graph's joint graph was merged by the partitioner
        merge_common_subexpressions(gm)
    sink_gathers(gm)
    hoist_views(gm)
    for region in fuse_regions(gm, direction, emulate_precision_casts):
        compile_region_ahead(region)
    run = boxed(gm)
    if tree is None:
        return run
    if direction == "backward":
        return record_backward(tree, gm, example_inputs, run)
    return record_forward(tree, gm, example_inputs, run, is_inference=direction == "inference")


def boxed(gm: GraphModule) -> Callable:
    """``gm`` called with AOTAutograd's boxed convention: one list of arguments, which the call
    empties, so that each input (a saved activation, in a backward) is freed after its last
    use in the graph instead of living to the end of the call. CUDA graph trees require it."""
    try:
        from torch.fx.graph import _BoxedCodeGen
    except ImportError:  # an older torch: the list is emptied, the inputs live to the end
        forward = make_boxed_func(gm.forward)

        def run(args: list[Any]) -> Any:
            taken = list(args)
            args.clear()
            return forward(taken)
    else:
        gm.graph.set_codegen(_BoxedCodeGen())
        gm.recompile()
        forward = gm.forward

        def run(args: list[Any]) -> Any:
            return forward(args)
    run._boxed_call = True
    return run


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
    backend=fusecut.dynamo.backend(partitioner="min_cut", cuda_graphs=True))``."""
    opts = Options(**options_of(None, options))
    partition_fn = _partition_fn(opts)

    def compile_dynamo_graph(gm: GraphModule, example_inputs: Sequence[Any]) -> Callable:
        # one tree per Dynamo graph: its forward and backward are recorded together
        tree = GraphTree(len(example_inputs)) if opts.cuda_graphs else None
        graph_options = {"tree": tree, "emulate_precision_casts": opts.emulate_precision_casts}
        return aot_autograd(
            fw_compiler=functools.partial(compile_graph, "forward", **graph_options),
            bw_compiler=functools.partial(compile_graph, "backward", **graph_options),
            inference_compiler=functools.partial(compile_graph, "inference", **graph_options),
            partition_fn=partition_fn,
            decompositions=DECOMPOSITIONS,
            keep_inference_input_mutations=True,
        )(gm, example_inputs)

    compile_dynamo_graph.options = opts
    return compile_dynamo_graph


def fusecut_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                    mode: str | None = None, options: dict[str, Any] | None = None) -> Callable:
    """``backend="fusecut"``, with torch.compile's ``mode`` and ``options``:
    ``torch.compile(m, backend="fusecut", mode="reduce-overhead")`` records CUDA graphs,
    ``options={"partitioner": "min_cut"}`` sets ``backend(...)``'s options."""
    return backend(**options_of(mode, options))(gm, example_inputs)


def options_of(mode: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """``backend(...)``'s options from torch.compile's ``mode`` and ``options``."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"fusecut backend: mode must be one of {', '.join(MODES)}, got "
                         f"{mode!r}")
    chosen = dict(MODES[mode or "default"])
    for name, value in (options or {}).items():
        if name not in Options.__dataclass_fields__:
            raise ValueError(f"fusecut backend: unknown option {name!r}; the options are "
                             f"{', '.join(Options.__dataclass_fields__)}")
        chosen[name] = value
    return chosen
