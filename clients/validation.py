"""``fd.validate``: a fusion's outputs against fusecut's torch reference, with nvFuser's
tolerances.

The tolerance of an output depends on its dtype and on the largest reduction it depends on
(summing N float32 values loses more than one multiply): nvFuser's measured table
(``csrc/validator_utils.h``: the worst error seen summing N values in float32 and in half
precision), whose entry one size up is the absolute tolerance and 1% of it the relative one;
ten times that for bfloat16 and the 8- and 4-bit floats after a reduction (their fewer mantissa
bits: one rounding flip of a bf16 value near 8 is 0.0625). A reduction's size multiplies the
sizes of the reductions before it, as nvFuser's ``ReductionSizeMapper`` counts (a sum of sums of
128 values each combines 128 * 128 of them). Integers and bools must match exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fusecut.optimizer.analysis.shapes import Bound, bind
from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.opspec import OpClass, get_spec
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import meta_of

# (reduction size, largest error measured) for float32 and for 16-bit floats
SUM_TOLERANCES_FLOAT = (
    (4, 1.68222e-06), (8, 2.23704e-06), (16, 2.95788e-06), (32, 4.4778e-06), (64, 6.75395e-06),
    (128, 8.57934e-06), (256, 1.30594e-05), (512, 2.19122e-05), (1024, 3.3451e-05),
    (2048, 5.78476e-05), (4096, 0.000108292), (8192, 0.00012207), (16384, 0.000136882),
    (32768, 0.000248561), (65536, 0.000407594), (131072, 0.000500901), (262144, 0.000923019),
    (524288, 0.00156909), (1048576, 0.00223107), (2097152, 0.00343043))
SUM_TOLERANCES_HALF = (
    (4, 0.00390625), (8, 0.0078125), (16, 0.0078125), (32, 0.0155334), (64, 0.0156269),
    (128, 0.0312042), (256, 0.0312548), (512, 0.0619979), (1024, 0.0625103), (2048, 0.124686),
    (4096, 0.12501), (8192, 0.24945), (16384, 0.250049), (32768, 0.498946), (65536, 0.500071),
    (131072, 0.985087), (262144, 1.00006), (524288, 1.99234), (1048576, 2.00032),
    (2097152, 3.99073))


class ValidationError(AssertionError):
    """An output differs from the reference by more than its tolerance (an AssertionError, as
    nvFuser's validate raises)."""


# nvFuser's getTolerance scales the half table by 10 for these after a reduction
_COARSE = frozenset(d for d in DType if d.value.startswith(("bfloat16", "float8", "float4")))


def tolerance(dtype: DType, reduction_size: int) -> tuple[float, float]:
    """(absolute, relative) tolerance of a ``dtype`` output after reducing that many values."""
    table = SUM_TOLERANCES_FLOAT if dtype in (DType.float32, DType.float64, DType.complex64,
                                              DType.complex128) else SUM_TOLERANCES_HALF
    if reduction_size <= 1:
        return table[0][1], table[1][1]
    entry = 0
    while entry < len(table) and table[entry][0] < reduction_size:
        entry += 1
    atol = table[entry + 1][1] if entry + 1 < len(table) else table[-1][1] * 2
    if dtype in _COARSE:
        atol *= 10.0
    return atol, atol * 0.01


def reduction_sizes(bound: Bound) -> dict[str, int]:
    """Per tensor: how many values the reductions (and matmuls' inner dimensions) on its way from
    the inputs combined into one: an op's own reduced extent times its inputs' largest count,
    as nvFuser's ReductionSizeMapper counts."""
    fusion = bound.fusion
    size: dict[str, int] = {n: 1 for n in fusion.tensors}
    for op in fusion.ops:
        outs = [o for o in op.outputs if o in fusion.tensors]
        if not outs:
            continue
        here = max((size.get(n, 1) for n in op.inputs if n in fusion.tensors), default=1)
        spec = get_spec(op.name)
        src = next((n for n in op.inputs if n in fusion.tensors), None)
        if src is not None and spec.op_class is OpClass.REDUCTION:
            here *= max(1, max(1, bound.numel(src)) // max(1, bound.numel(outs[0])))
        elif src is not None and spec.op_class is OpClass.LIBRARY and bound.shapes[src]:
            here *= max(1, bound.shapes[src][-1])
        for o in outs:
            size[o] = here
    return size


def validate_outputs(fusion: Fusion, outputs: list[torch.Tensor], inputs: list[Any],
                     reference: list[torch.Tensor] | None = None) -> None:
    """Compare ``outputs`` with ``reference`` (fusecut's torch reference of ``fusion`` on
    ``inputs`` when not given); ValidationError names the first output out of tolerance."""
    bound = bind(fusion, [meta_of(a) for a in inputs])
    if reference is None:
        reference = run_reference(fusion, list(inputs), bound)
    if len(reference) != len(outputs):
        raise ValidationError(f"Expected {len(outputs)} reference outputs for validation, got "
                              f"{len(reference)}")
    sizes = reduction_sizes(bound)
    for k, (name, got, want) in enumerate(zip(fusion.outputs, outputs, reference)):
        if tuple(got.shape) != tuple(want.shape):
            raise ValidationError(f"output {k} ({name}): shape {list(got.shape)}, reference "
                                  f"{list(want.shape)}")
        if got.is_floating_point() or got.is_complex():
            atol, rtol = tolerance(fusion.tensors[name].dtype, sizes.get(name, 1))
            g, w = _comparable(got), _comparable(want.to(got.device))
            if not torch.allclose(g, w, atol=atol, rtol=rtol, equal_nan=True):
                worst = float((g - w).abs().nan_to_num(math.inf).max()) if g.numel() else 0.0
                raise ValidationError(f"output {k} ({name}): max error {worst:.3g} exceeds "
                                      f"atol {atol:.3g}, rtol {rtol:.3g}")
        elif not torch.equal(got, want.to(got.device)):
            raise ValidationError(f"output {k} ({name}): values differ from the reference "
                                  f"({got.dtype}: compared exactly)")


def _comparable(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return t.to(torch.complex128)
    try:
        return t.to(torch.float64)
    except RuntimeError as e:  # packed fp4 and the like
        raise InputError(f"cannot compare {t.dtype} values: {e}") from None
