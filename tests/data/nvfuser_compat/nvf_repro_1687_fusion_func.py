# From NVIDIA/Fuser 81c4b22fd750, tests/python/direct/test_repro.py line 1687 (fusion_func).
# BSD-3-Clause, Copyright NVIDIA CORPORATION: see LICENSE in this folder.
from nvfuser import DataType, FusionDefinition


def fusion_func(fd: FusionDefinition) -> None:
    t0 = fd.define_tensor(shape=[-1])
    t1 = fd.ops.slice(t0, start_indices=[0], end_indices=[5])
    t2 = fd.ops.neg(t1)
    t3 = fd.ops.slice(t2, start_indices=[0], end_indices=[2])
    t4 = fd.ops.neg(t3)
    fd.add_output(t4)
