# RMSNorm forward (Llama style), bf16 in/out; saves the reciprocal root-mean-square.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.ops.cast(T0, dtype=DataType.Float)
    T3 = fd.ops.mul(T2, T2)
    T4 = fd.ops.sum(T3, dims=[1], keepdim=False, dtype=DataType.Null)
    S5 = fd.ops.reciprocal(T0.size(1))
    T6 = fd.ops.mul(T4, S5)
    S7 = fd.define_scalar(1e-06, dtype=DataType.Double)
    T8 = fd.ops.add(T6, S7)
    T9 = fd.ops.rsqrt(T8)
    T10 = fd.ops.broadcast_in_dim(T9, shape=T0.shape(), broadcast_dims=[0])
    T11 = fd.ops.mul(T2, T10)
    T12 = fd.ops.cast(T1, dtype=DataType.Float)
    T13 = fd.ops.broadcast_in_dim(T12, shape=T0.shape(), broadcast_dims=[1])
    T14 = fd.ops.mul(T11, T13)
    T15 = fd.ops.cast(T14, dtype=DataType.BFloat16)
    fd.add_output(T15)
    fd.add_output(T9)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((16384, 8192), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8192,), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
