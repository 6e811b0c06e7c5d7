# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 1264 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False, stride_order=[2, 1, 0])
    T2 = fd.ops.linear(T1, T0)
    S3 = fd.define_scalar(1.41421, dtype=DataType.Double)
    T4 = fd.ops.mul(T2, S3)
    fd.add_output(T2)
    fd.add_output(T4)
