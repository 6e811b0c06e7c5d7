# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 95 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    inp = fd.define_tensor([2, 3], contiguity=True)
    out = fd.ops.add(inp, inp)
    fd.add_output(out)
