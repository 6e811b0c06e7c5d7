# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 129 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    inp = fd.define_tensor([1, 2], contiguity=True, stride_order=[0, 1])
    out = fd.ops.add(inp, inp)
    fd.add_output(out)
