# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_python_frontend.py line 353 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    c4 = fd.define_scalar(None, dtype=DataType.Int)
    c5 = fd.define_scalar(None, dtype=DataType.Int)
    c6 = fd.define_scalar(None, dtype=DataType.Float)
    tv1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    tv3 = fd.ops.full((c4, c5), c6, DataType.Float)
    tv4 = fd.ops.add(tv3, tv1)
    fd.add_output(tv4)
