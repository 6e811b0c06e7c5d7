# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 553 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[1, -1, -1], contiguity=True, dtype=DataType.Float, is_cpu=False, stride_order=[2, 1, 0])
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T2 = fd.ops.sum(T1, dims=[1], keepdim=False, dtype=DataType.Null)
    T3 = fd.ops.sum(T0, dims=[1, 0], keepdim=False, dtype=DataType.Null)
    S4 = fd.define_scalar(4, dtype=DataType.Int)
    T6 = fd.ops.reshape(T2, new_shape=[S4])
    S7 = fd.define_scalar(4, dtype=DataType.Int)
    T9 = fd.ops.reshape(T3, new_shape=[S7])
    T10 = fd.ops.mul(T6, T9)
    T11 = fd.ops.sum(T10, dims=[0], keepdim=False, dtype=DataType.Null)
    fd.add_output(T11)
