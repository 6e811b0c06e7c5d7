# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 2396 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[1, 1, 576], contiguity=[None, None, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T1 = fd.define_tensor(shape=[1, 576], contiguity=[None, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[1, 0])
    T5 = fd.ops.reshape(T0, new_shape=[1, 576])
    T6 = fd.ops.set(T5)
    fd.add_output(T6, T1)
    fd.add_output(T5)
