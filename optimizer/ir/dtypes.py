"""Data types of the fusion IR and nvFuser's names for them.

fusecut speaks canonical names (``float32``, ``bfloat16`` ...) on the wire; the nvFuser Python
frontend spells them ``DataType.Float``, ``DataType.BFloat16`` and so on. Type promotion follows
nvFuser (which follows PyTorch): tensors dominate scalars of the same category, a scalar of a
higher category lifts the result to the default type of that category.
"""

from __future__ import annotations

from enum import Enum


class DType(str, Enum):
    bool = "bool"
    int32 = "int32"
    int64 = "int64"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    float64 = "float64"
    # Narrow and wide types nvFuser speaks, planned with their bytes. float8_e4m3fn and
    # float8_e5m2 are stored and converted in generated kernels (computed in float32); the
    # others run through the torch reference (see REFERENCE_ONLY).
    float8_e4m3fn = "float8_e4m3fn"
    float8_e5m2 = "float8_e5m2"
    float8_e8m0fnu = "float8_e8m0fnu"
    float4_e2m1fn = "float4_e2m1fn"  # half a byte per element
    float4_e2m1fn_x2 = "float4_e2m1fn_x2"  # two fp4 values packed in a byte
    complex64 = "complex64"
    complex128 = "complex128"
    uint64 = "uint64"

    def __call__(self) -> DType:
        """``t.dtype()``: nvfuser_direct's Tensor.dtype is a method, the legacy frontend's an
        attribute; a DType called gives itself, so both spellings read a handle's dtype."""
        return self

    @property
    def itemsize(self) -> float:
        return _ITEMSIZE[self]

    def nbytes(self, numel: int) -> int:
        """Whole bytes of ``numel`` elements (packed fp4 rounds up): an integer, as the
        planner's solvers (OR-Tools' max flow, CP-SAT) need."""
        size = _ITEMSIZE[self]
        return numel * int(size) if size >= 1 else -(-numel // round(1 / size))

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in (DType.int32, DType.int64, DType.uint64)

    @property
    def is_complex(self) -> bool:
        return self in (DType.complex64, DType.complex128)

    @property
    def is_floating_or_complex(self) -> bool:
        return self in _FLOATS or self.is_complex

    @property
    def reference_only(self) -> bool:
        """No generated kernel reads or writes it: ops touching it run through torch."""
        return self in REFERENCE_ONLY

    @property
    def is_bool(self) -> bool:
        return self is DType.bool

    @property
    def is_half(self) -> bool:
        """16-bit floats: stored natively, computed in float32 (as nvFuser does)."""
        return self in (DType.float16, DType.bfloat16)

    @property
    def category(self) -> int:
        """bool < integer < floating point < complex: a scalar of a higher category lifts a
        tensor's type (promotion)."""
        return 0 if self.is_bool else 1 if self.is_int else 3 if self.is_complex else 2

    @property
    def compute(self) -> DType:
        """The type arithmetic on this type is carried out in."""
        return DType.float32 if self.is_half or self in _NARROW_FLOATS else self


_ITEMSIZE = {
    DType.bool: 1,
    DType.int32: 4,
    DType.int64: 8,
    DType.float16: 2,
    DType.bfloat16: 2,
    DType.float32: 4,
    DType.float64: 8,
    DType.float8_e4m3fn: 1,
    DType.float8_e5m2: 1,
    DType.float8_e8m0fnu: 1,
    DType.float4_e2m1fn: 0.5,
    DType.float4_e2m1fn_x2: 1,
    DType.complex64: 8,
    DType.complex128: 16,
    DType.uint64: 8,
}
_NARROW_FLOATS = frozenset({DType.float8_e4m3fn, DType.float8_e5m2, DType.float8_e8m0fnu,
                            DType.float4_e2m1fn, DType.float4_e2m1fn_x2})
_FLOATS = frozenset({DType.float16, DType.bfloat16, DType.float32, DType.float64}) | _NARROW_FLOATS
# nvFuser's types beyond fusecut's core seven
EXTENDED = _NARROW_FLOATS | {DType.complex64, DType.complex128, DType.uint64}
# 8-bit floats generated kernels load and store (converted to and from float32 as torch does)
KERNEL_FP8 = frozenset({DType.float8_e4m3fn, DType.float8_e5m2})
REFERENCE_ONLY = EXTENDED - KERNEL_FP8

# the values each integer type holds, inclusive
INT_RANGES = {DType.int32: (-2**31, 2**31 - 1), DType.int64: (-2**63, 2**63 - 1),
              DType.uint64: (0, 2**64 - 1)}


def fits_int64(value: int) -> bool:
    low, high = INT_RANGES[DType.int64]
    return low <= value <= high


# nvFuser's DataType member names -> canonical dtype. ``Null`` means "not given".
NVFUSER_DTYPES: dict[str, DType | None] = {
    "Bool": DType.bool,
    "Int32": DType.int32,
    "Int": DType.int64,
    "Index": DType.int64,
    "Half": DType.float16,
    "BFloat16": DType.bfloat16,
    "Float": DType.float32,
    "Double": DType.float64,
    "Float8_e4m3fn": DType.float8_e4m3fn,
    "Float8_e5m2": DType.float8_e5m2,
    "Float8_e8m0fnu": DType.float8_e8m0fnu,
    "Float4_e2m1fn": DType.float4_e2m1fn,
    "Float4_e2m1fn_x2": DType.float4_e2m1fn_x2,
    "ComplexFloat": DType.complex64,
    "ComplexDouble": DType.complex128,
    "UInt64": DType.uint64,
    "Null": None,
}
NVFUSER_NAME: dict[DType, str] = {
    DType.bool: "Bool",
    DType.int32: "Int32",
    DType.int64: "Int",
    DType.float16: "Half",
    DType.bfloat16: "BFloat16",
    DType.float32: "Float",
    DType.float64: "Double",
    **{d: n for n, d in NVFUSER_DTYPES.items() if d is not None and d in EXTENDED},
}
# Types nvFuser has that fusecut does not support, so the error can say so precisely.
UNSUPPORTED_NVFUSER_DTYPES = {
    "UInt32",
    "UInt16",
    "UInt8",
    "Int8",
    "Int16",
}

# torch.<name> -> canonical dtype, for the repro's ``inputs = [...]`` list.
TORCH_DTYPES: dict[str, DType] = {
    "bool": DType.bool,
    "int32": DType.int32,
    "int": DType.int32,
    "int64": DType.int64,
    "long": DType.int64,
    "float16": DType.float16,
    "half": DType.float16,
    "bfloat16": DType.bfloat16,
    "float32": DType.float32,
    "float": DType.float32,
    "float64": DType.float64,
    "double": DType.float64,
    **{d.value: d for d in EXTENDED if d is not DType.float4_e2m1fn},
}


def promote(a: DType, b: DType) -> DType:
    """Promotion of two tensor types (same rules as torch.promote_types for our types)."""
    if a == b:
        return a
    if a.category != b.category:
        high, low = (a, b) if a.category > b.category else (b, a)
        if high is DType.complex64 and low is DType.float64:
            return DType.complex128  # torch keeps double precision in the complex result
        return high
    if a.is_float:
        if {a, b} == {DType.float16, DType.bfloat16}:
            return DType.float32
        return a if a.itemsize >= b.itemsize else b
    return a if a.itemsize >= b.itemsize else b


def default_for_category(category: int) -> DType:
    return (DType.bool, DType.int64, DType.float32, DType.complex64)[category]


def result_type(tensor_types: list[DType], scalar_types: list[DType]) -> DType:
    """Result type of a pointwise op over tensors and scalars, nvFuser/PyTorch style.

    Scalars only take part when they are of a higher category than every tensor; then the result is
    that category's default type (a double scalar times an int tensor gives float32).
    """
    if not tensor_types:
        out = scalar_types[0]
        for s in scalar_types[1:]:
            out = promote(out, s)
        return out
    out = tensor_types[0]
    for t in tensor_types[1:]:
        out = promote(out, t)
    if scalar_types:
        top = max(s.category for s in scalar_types)
        if top > out.category:
            # torch: a complex scalar with a double tensor gives complex128
            out = DType.complex128 if (top == 3 and out is DType.float64) else \
                default_for_category(top)
    return out
