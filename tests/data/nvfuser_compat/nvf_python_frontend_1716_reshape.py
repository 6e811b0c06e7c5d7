# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 1716 (reshape).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def reshape(fd: FusionDefinition) -> None:
    x = fd.define_tensor([2, 3, 4], contiguity=[True, True, True], dtype=DataType.Float)
    y = fd.ops.reshape(x, [2, 12])
    fd.add_output(y)
