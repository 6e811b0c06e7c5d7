# The full-op forwarding example (seed 003_6ab639bba4c398f7.txt): a full() used on both sides of a
# forced segment boundary must be recomputed in each segment, never passed through global memory.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False)
    S1 = fd.define_scalar(1.00000, dtype=DataType.Double)
    T1 = fd.ops.full(shape=[T0.size(0)], fill_value=S1, dtype=DataType.Float)
    T2 = fd.ops.add(T0, T1)
    T3 = fd.ops.segment_set(T2)
    T4 = fd.ops.add(T3, T1)
    fd.add_output(T4)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((16777216,), dtype=torch.float32, device='cuda:0'),
]
fd.execute(inputs)
