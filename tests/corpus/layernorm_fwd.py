# LayerNorm forward, bf16 in/out, float math; saves mean and inverse std for the backward.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T3 = fd.ops.cast(T0, dtype=DataType.Float)
    T4, T5 = fd.ops.var_mean(T3, dims=[1], correction=0, keepdim=False)
    T6 = fd.ops.broadcast_in_dim(T5, shape=T0.shape(), broadcast_dims=[0])
    T7 = fd.ops.sub(T3, T6)
    S8 = fd.define_scalar(1e-05, dtype=DataType.Double)
    T9 = fd.ops.add(T4, S8)
    T10 = fd.ops.rsqrt(T9)
    T11 = fd.ops.broadcast_in_dim(T10, shape=T0.shape(), broadcast_dims=[0])
    T12 = fd.ops.mul(T7, T11)
    T13 = fd.ops.cast(T1, dtype=DataType.Float)
    T14 = fd.ops.broadcast_in_dim(T13, shape=T0.shape(), broadcast_dims=[1])
    T15 = fd.ops.mul(T12, T14)
    T16 = fd.ops.cast(T2, dtype=DataType.Float)
    T17 = fd.ops.broadcast_in_dim(T16, shape=T0.shape(), broadcast_dims=[1])
    T18 = fd.ops.add(T15, T17)
    T19 = fd.ops.cast(T18, dtype=DataType.BFloat16)
    fd.add_output(T19)
    fd.add_output(T5)
    fd.add_output(T10)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((32768, 4096), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4096,), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4096,), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
