"""Limits on what an execution makes, checked against the plan before anything runs.

A plan is made from metadata, so a 4-byte input broadcast to 16384 x 16384, or a 64 GiB
intermediate, plans fine; run, it would fill the memory (or die in the allocator). The plan knows
every tensor's size: an execution whose outputs, together, or any tensor it computes, would pass
the limits is refused first, naming the tensor. So is one whose computed tensors alive at once
would pass the intermediate limit together (issue 32: twenty tensors each under the limit, kept
alive by one op that reads them all, made twenty times the limit from a 2 KB request): the plan
is walked in the order it runs, each tensor alive from the op that makes it to its last reader,
as the executor and the torch reference free them.
"""

from __future__ import annotations

import math

from fusecut.optimizer.errors import FusecutError, counted
from fusecut.optimizer.plan.plan import Plan


class ResultTooLarge(FusecutError):
    """An execution would make more bytes than the limits allow."""


def check_result_sizes(plan: Plan, max_output_bytes: int, max_tensor_bytes: int) -> None:
    """Refuse ``plan`` if any tensor it computes passes ``max_tensor_bytes`` (at its logical
    size: the torch reference materialises every op's result), or the ones alive at once do
    together, or its outputs together pass ``max_output_bytes``."""
    fusion, bound = plan.fusion, plan.bound

    def nbytes(name: str) -> int:
        return math.ceil(math.prod(bound.shapes[name]) * fusion.value_dtype(name).itemsize)

    def described(name: str) -> str:
        shape = ", ".join(map(str, bound.shapes[name]))
        return f"{name} [{shape}] {fusion.value_dtype(name).value}: {nbytes(name)} bytes"

    for index, op in enumerate(fusion.ops):
        for name in op.outputs:
            if name in fusion.tensors and nbytes(name) > max_tensor_bytes:
                raise ResultTooLarge(f"op {index} ({op.name}) makes {described(name)}, over "
                                     f"the limit of {max_tensor_bytes} bytes for any tensor "
                                     f"an execution computes")
    check_live_bytes(plan, nbytes, described, max_tensor_bytes)
    total = sum(nbytes(name) for name in fusion.outputs if name in fusion.tensors)
    if total > max_output_bytes:
        largest = max((n for n in fusion.outputs if n in fusion.tensors), key=nbytes)
        raise ResultTooLarge(f"the outputs hold {total} bytes (the largest, {described(largest)})"
                             f", over the limit of {max_output_bytes} bytes per execution")


def check_live_bytes(plan: Plan, nbytes, described, limit: int) -> None:
    """Refuse ``plan`` if the tensors it computes that are alive at once pass ``limit`` bytes.

    Walks the segments in plan order and each one's ops in order: an op's results are alive
    from it to their last reader in the segment (every one of them at its logical size: the
    torch reference materialises each result); a segment's outputs stay alive, compact, until
    the last segment that reads them (fusion outputs to the end). Fusion inputs are the
    request's, bounded by the tensor limit, and not counted."""
    fusion, bound = plan.fusion, plan.bound
    inputs = set(fusion.inputs)
    outputs = set(fusion.outputs)
    last_segment: dict[str, int] = {}
    for seg in plan.segments:
        for t in seg.schedule.inputs:
            last_segment[t] = seg.index

    def compact_bytes(name: str) -> int:
        return math.ceil(math.prod(bound.compact_shape(name))
                         * fusion.value_dtype(name).itemsize)

    across: dict[str, int] = {}  # written by a segment, alive until their last reader
    across_bytes = 0
    for seg in plan.segments:
        ops = [fusion.ops[i] for i in seg.schedule.ops]
        last_use = {n: k for k, op in enumerate(ops) for n in op.inputs}
        kept = set(seg.schedule.outputs)
        local: dict[str, int] = {}
        local_bytes = 0
        for k, (index, op) in enumerate(zip(seg.schedule.ops, ops)):
            for name in op.outputs:
                if name in fusion.tensors and name not in local:
                    local[name] = nbytes(name)
                    local_bytes += local[name]
            if across_bytes + local_bytes > limit:
                alive = {**across, **local}
                largest = max(alive, key=alive.get)
                raise ResultTooLarge(
                    f"op {index} ({op.name}) in segment {seg.index} would keep "
                    f"{across_bytes + local_bytes} bytes of computed tensors alive at once "
                    f"({counted(len(alive), 'tensor')}; the largest {described(largest)}), "
                    f"over the "
                    f"limit of {limit} bytes an execution may compute at once")
            for name in op.inputs:
                if last_use[name] == k and name in local and name not in kept:
                    local_bytes -= local.pop(name)
        for name in seg.schedule.outputs:
            if name not in across and name not in inputs:
                across[name] = compact_bytes(name)
                across_bytes += across[name]
        for name in seg.schedule.inputs:
            if last_segment.get(name) == seg.index and name in across and name not in outputs:
                across_bytes -= across.pop(name)
