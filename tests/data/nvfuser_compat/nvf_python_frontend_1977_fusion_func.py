# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 1977 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True])
    t1 = fd.ops.sum(t0, dims=[2])
    t1_b = fd.ops.broadcast_in_dim(t1, t0.shape(), [0, 1])
    fd.add_output(t1_b)
