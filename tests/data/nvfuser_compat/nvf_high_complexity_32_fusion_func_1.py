# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_high_complexity.py line 32 (fusion_func_1).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func_1(fd: FusionDefinition):
    t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True])
    t1 = fd.define_tensor(shape=[-1], contiguity=[True])
    t1_b = fd.ops.broadcast_in_dim(t1, t0.shape(), [2])
    t2 = fd.ops.add(t0, t1_b)
    fd.add_output(t2)
