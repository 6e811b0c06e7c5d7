# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 2111 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    T1 = fd.define_tensor(shape=[1, -1, 1, 1], contiguity=[True, None, None, None], dtype=DataType.Double, is_cpu=False, stride_order=[0, 3, 2, 1])
    S1 = fd.define_scalar(2.0, dtype=DataType.Double)
    T2 = fd.ops.mul(T1, S1)
    fd.add_output(T2)
