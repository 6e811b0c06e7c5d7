# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 2566 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    S1 = fd.define_scalar(None, dtype=DataType.Double)
    T2 = fd.ops.ge(T0, S1)
    fd.add_output(T2)
