# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 424 (dynamic_reshape).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def dynamic_reshape(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1], [True, True])
    d0 = fd.ops.size(x, 0)
    d1 = fd.define_scalar(dtype=DataType.Int32)
    d2 = fd.define_scalar(dtype=DataType.Int32)
    y = fd.ops.reshape(x, [d0, d1, d2])
    fd.add_output(y)
