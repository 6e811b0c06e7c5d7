# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 2727 (fusion_with_expand).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_with_expand(fd: FusionDefinition):
    t0 = fd.define_tensor(shape=[1, -1], contiguity=[None, True])
    t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True])
    t2 = fd.ops.expand(t0, t1.shape())
    t3 = fd.ops.add(t2, t1)
    fd.add_output(t3)
