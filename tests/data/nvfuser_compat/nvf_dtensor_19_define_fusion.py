# From NVIDIA/Fuser 81c4b22fd750, tests/python/multidevice/test_dtensor.py line 19 (define_fusion).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def define_fusion(fd: FusionDefinition):
    inp = fd.define_tensor((-1, -1), contiguity=False, dtype=DataType.Float)
    one = fd.define_scalar(1.0, dtype=DataType.Float)
    out = fd.ops.add(inp, one)
    fd.add_output(out)
