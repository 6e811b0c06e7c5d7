# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 1748 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition):
    inp = fd.define_tensor([1, 1, 2], contiguity=True)
    out = fd.ops.squeeze(inp, [0, 1])
    out = fd.ops.slice(out, [1], [2])
    fd.add_output(out)
