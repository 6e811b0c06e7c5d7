# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 1644 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T3 = fd.ops.add(T1, T0)
    T4 = fd.ops.neg(T0)
    fd.add_output(T3)
    fd.add_output(T4, T0)
