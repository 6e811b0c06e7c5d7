# The input-broadcast example from the root->logical proposal (seed 002_1a494d39bae6cd34.txt):
# tv2 = neg(tv0); tv3 = broadcast(tv2); tv4 = mul(tv3, tv1).
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T2 = fd.ops.neg(T0)
    T3 = fd.ops.broadcast(T2, is_broadcast_dim=[False, True])
    T4 = fd.ops.mul(T3, T1)
    fd.add_output(T4)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8192,), dtype=torch.float32, device='cuda:0'),
    torch.randn((8192, 8192), dtype=torch.float32, device='cuda:0'),
]
fd.execute(inputs)
