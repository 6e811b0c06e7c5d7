"""CUDA graphs for the backend's compiled graphs: ``backend(cuda_graphs=True)``, or
``torch.compile(model, backend="fusecut", mode="reduce-overhead")``.

The idea: a training step of many small regions spends its time on the host (Python, argument
checks, one driver call per kernel), not on the GPU. Recorded once as a CUDA graph, every later
step is one replay. Each AOTAutograd graph (forward, backward, inference), with its fusecut
regions and its ATen ops, is handed to Inductor's CUDA graph trees as it is, which is what
torch's own ``cudagraphs`` backend and ``mode="reduce-overhead"`` do: the first call runs as it
is (the regions plan and compile their kernels then), the next is recorded into the trees'
memory pool, later ones replay; parameters are static inputs, other inputs are copied in, and a
forward and its backward share one tree, so the backward reads the forward's saved values in
place.

A graph that cannot be recorded (an op on the CPU, more than one device, an input it mutates,
an op CUDA graphs do not take) runs without, as torch's backend does: said in the
``cudagraph_skips`` counter and in a warning on ``torch._inductor``'s CUDA graphs log. Regions
launch on torch's current stream through the caching allocator, so a recording captures them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule


@dataclass
class GraphTree:
    """What the forward and the backward of one Dynamo graph share: whether the forward was
    recorded (a backward is only recorded beside a recorded forward), and its device."""

    dynamo_inputs: int
    recorded: bool = True
    device_index: int | None = None


def skip_reason(gm: GraphModule, fixed: int) -> str | None:
    """Why ``gm`` cannot be recorded (its first ``fixed`` inputs are static), or None."""
    from torch._dynamo.backends.cudagraphs import check_for_skip

    return check_for_skip(gm, fixed)


def record_forward(tree: GraphTree, gm: GraphModule, example_inputs: Sequence[Any],
                   run: Callable, is_inference: bool = False) -> Callable:
    """``run`` (a boxed call of ``gm``) recorded and replayed, or ``run`` when it cannot be."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter
    from torch._inductor.utils import num_fw_fixed_arguments

    fixed = num_fw_fixed_arguments(tree.dynamo_inputs, len(example_inputs))
    if reason := skip_reason(gm, fixed):
        tree.recorded = False
        log_cudagraph_skip_and_bump_counter(f"fusecut: skipping cudagraphs due to {reason}")
        return run
    from torch._dynamo.backends.cudagraphs import get_device_index

    tree.device_index = get_device_index(gm)
    return _cudagraphify(gm, run, example_inputs, fixed, tree.device_index,
                         is_backward=False, is_inference=is_inference)


def record_backward(tree: GraphTree, gm: GraphModule, example_inputs: Sequence[Any],
                    run: Callable) -> Callable:
    """The backward of a recorded forward, recorded into the same tree; else ``run``."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter
    from torch._inductor.utils import count_tangents

    if not tree.recorded:
        return run
    fixed = count_tangents(gm)
    if reason := skip_reason(gm, fixed):
        log_cudagraph_skip_and_bump_counter(f"fusecut: skipping cudagraphs due to {reason}")
        manager = torch._inductor.cudagraph_trees.get_manager(
            tree.device_index or 0, create_if_none_exists=False)

        def unrecorded(inputs: list[Any]) -> Any:
            # the tree must know its forward's outputs are now the backward's to free
            if manager is not None:
                manager.set_to_running_backward()
            return run(inputs)

        unrecorded._boxed_call = True
        return unrecorded
    from torch._dynamo.backends.cudagraphs import get_device_index

    return _cudagraphify(gm, run, example_inputs, fixed, get_device_index(gm),
                         is_backward=True, is_inference=False)


def _cudagraphify(gm: GraphModule, run: Callable, example_inputs: Sequence[Any], fixed: int,
                  device_index: int, is_backward: bool, is_inference: bool) -> Callable:
    from torch._dynamo.backends.cudagraphs import find_input_mutations, get_stack_traces
    from torch._inductor.cudagraph_trees import cudagraphify_impl
    from torch._inductor.cudagraph_utils import get_placeholder_info

    recorded = cudagraphify_impl(
        run, list(example_inputs), range(fixed), device_index=device_index,
        is_backward=is_backward, is_inference=is_inference,
        stack_traces=get_stack_traces(gm), placeholders=get_placeholder_info(gm.graph),
        mutated_input_idxs=find_input_mutations(gm.graph))
    recorded._boxed_call = True
    return recorded
