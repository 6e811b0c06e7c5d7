# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_high_complexity.py line 750 (nvfuser_fusion_1).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_1(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.ops.slice(T0, start_indices=[0, 0, 0], end_indices=[16, 128, 1024], strides=[1, 1, 1])
    T2 = fd.ops.slice(T0, start_indices=[0, 0, 1024], end_indices=[16, 128, 2048], strides=[1, 1, 1])
    T3 = fd.ops.slice(T0, start_indices=[0, 0, 2048], end_indices=[16, 128, 3072], strides=[1, 1, 1])
    fd.add_output(T1)
    fd.add_output(T2)
    fd.add_output(T3)
