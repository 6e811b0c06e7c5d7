# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 2203 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[2, 2], contiguity=[False, True], dtype=DataType.Float, is_cpu=False, stride_order=[0, 1])
    S1 = fd.define_scalar(0.0, dtype=DataType.Double)
    T2 = fd.ops.gt(T0, S1)
    S3 = fd.define_scalar(0.0, dtype=DataType.Double)
    T4 = fd.ops.where(T2, T0, S3)
    T5 = fd.ops.cast(T4, dtype=DataType.Float)
    T6 = fd.ops.set(T5)
    fd.add_output(T6, T0)
    fd.add_output(T6)
