"""Limits on what an execution makes, checked against the plan before anything runs.

A plan is made from metadata, so a 4-byte input broadcast to 16384 x 16384, or a 64 GiB
intermediate, plans fine; run, it would fill the memory (or die in the allocator). The plan knows
every tensor's size: an execution whose outputs, together, or any tensor it computes, would pass
the limits is refused first, naming the tensor.
"""

from __future__ import annotations

import math

from fusecut.optimizer.errors import FusecutError
from fusecut.optimizer.plan.plan import Plan


class ResultTooLarge(FusecutError):
    """An execution would make more bytes than the limits allow."""


def check_result_sizes(plan: Plan, max_output_bytes: int, max_tensor_bytes: int) -> None:
    """Refuse ``plan`` if any tensor it computes passes ``max_tensor_bytes`` (at its logical
    size: the torch reference materialises every op's result), or its outputs together pass
    ``max_output_bytes``."""
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
    total = sum(nbytes(name) for name in fusion.outputs if name in fusion.tensors)
    if total > max_output_bytes:
        largest = max((n for n in fusion.outputs if n in fusion.tensors), key=nbytes)
        raise ResultTooLarge(f"the outputs hold {total} bytes (the largest, {described(largest)})"
                             f", over the limit of {max_output_bytes} bytes per execution")
