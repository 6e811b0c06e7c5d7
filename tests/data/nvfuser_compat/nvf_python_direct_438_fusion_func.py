# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_direct.py line 438 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False, stride_order=[0])
    s0 = fd.define_scalar()
    T1 = fd.ops.mul(T0, s0)
    fd.add_output(T1)
