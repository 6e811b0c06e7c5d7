# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 1931 (nvfuser_fusion_id28).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id28(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[5, 5], contiguity=[True, True], dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T1 = fd.define_tensor(shape=[5, 5], contiguity=[True, True], dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T2 = fd.define_tensor(shape=[5], contiguity=[True], dtype=DataType.Float, is_cpu=False, stride_order=[0])
    T3 = fd.ops.linear(T0, T1, T2)
    fd.add_output(T3)
