# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 2091 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    t0 = fd.define_tensor(shape=[0, 0], contiguity=[True, True], dtype=DataType.Float)
    t1 = fd.ops.relu(t0)
    fd.add_output(t1)
