# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 787 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    S0 = fd.define_scalar(1.0, dtype=DataType.Double)
    S1 = fd.define_scalar(5, dtype=DataType.Int)
    T3 = fd.ops.full(shape=[S1], fill_value=S0, dtype=DataType.Float)
    T4 = fd.ops.slice(T3, start_indices=[0], end_indices=[2], strides=[1])
    T5 = fd.ops.cast(T4, dtype=DataType.Half)
    T6 = fd.ops.slice(T3, start_indices=[2], end_indices=[5], strides=[1])
    T7 = fd.ops.cast(T6, dtype=DataType.Half)
    fd.add_output(T5)
    fd.add_output(T7)
