# The reduction + broadcast + pointwise example from the segmentation overview (seed 001_81d3c4724632459d.txt).
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id1(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T2 = fd.ops.sum(T0, dims=[1], keepdim=False, dtype=DataType.Float)
    T3 = fd.ops.broadcast(T2, is_broadcast_dim=[False, True])
    T4 = fd.ops.add(T1, T3)
    fd.add_output(T4)

with FusionDefinition() as fd:
    nvfuser_fusion_id1(fd)

inputs = [
    torch.randn((16384, 4096), dtype=torch.float32, device='cuda:0'),
    torch.randn((16384, 4096), dtype=torch.float32, device='cuda:0'),
]
fd.execute(inputs)
