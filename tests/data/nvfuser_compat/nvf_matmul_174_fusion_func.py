# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_matmul.py line 174 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    a = fd.define_tensor([1, 2, 3])
    b = fd.define_tensor([4, 3])
    c = fd.ops.linear(a, b)
    d = fd.ops.slice(c, start_indices=[0, 0, 0], end_indices=[1, 2, 3])
    fd.add_output(d)
