# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 1932 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True])
    t1 = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True])
    t2 = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True])
    t1_b = fd.ops.broadcast_in_dim(t1, t0.shape(), [0, 1, 2])
    t2_b = fd.ops.broadcast_in_dim(t2, t1_b.shape(), [0, 1, 2])
    fd.add_output(t2_b)
