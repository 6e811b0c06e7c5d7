# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 2719 (fusion_with_broadcast_in_dim).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_with_broadcast_in_dim(fd: FusionDefinition):
    t0 = fd.define_tensor(shape=[1, -1], contiguity=[None, True])
    t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True])
    t2 = fd.ops.broadcast_in_dim(t0, t1.shape(), [0, 1])
    t3 = fd.ops.add(t2, t1)
    fd.add_output(t3)
