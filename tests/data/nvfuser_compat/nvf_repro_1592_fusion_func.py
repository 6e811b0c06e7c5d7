# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 1592 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False, stride_order=[0])
    T2 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=False)
    T3 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=False)
    T4 = fd.ops.broadcast_in_dim(T2, shape=T1.shape(), broadcast_dims=[])
    T5 = fd.ops.add(T1, T4)
    T6 = fd.ops.sum(T5, dims=[0], keepdim=False)
    S0 = fd.define_scalar(1.0, dtype=DataType.Double)
    T7 = fd.ops.add(T3, S0)
    fd.add_output(T6, T3)
    fd.add_output(T7, T2)
