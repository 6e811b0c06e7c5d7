# GroupNorm forward as Thunder decomposes it (32 groups), bf16 in/out, float math: the channels
# are viewed as [groups, channels per group], each group's statistics and normalisation.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T3 = fd.ops.reshape(T0, new_shape=[32, 32, 10, 64, 64])
    T4 = fd.ops.cast(T3, dtype=DataType.Float)
    T5, T6 = fd.ops.var_mean(T4, dims=[2, 3, 4], correction=0, keepdim=False)
    T7 = fd.ops.broadcast_in_dim(T5, shape=[32, 32, 1, 1, 1], broadcast_dims=[0, 1])
    T8 = fd.ops.broadcast_in_dim(T6, shape=[32, 32, 1, 1, 1], broadcast_dims=[0, 1])
    S9 = fd.define_scalar(1e-05, dtype=DataType.Double)
    T10 = fd.ops.add(T7, S9)
    T11 = fd.ops.rsqrt(T10)
    T12 = fd.ops.broadcast_in_dim(T8, shape=[32, 32, 10, 64, 64], broadcast_dims=[0, 1, 2, 3, 4])
    T13 = fd.ops.sub(T4, T12)
    T14 = fd.ops.broadcast_in_dim(T11, shape=[32, 32, 10, 64, 64], broadcast_dims=[0, 1, 2, 3, 4])
    T15 = fd.ops.mul(T13, T14)
    T16 = fd.ops.reshape(T15, new_shape=[32, 320, 64, 64])
    T17 = fd.ops.broadcast_in_dim(T1, shape=[32, 320, 64, 64], broadcast_dims=[1])
    T18 = fd.ops.cast(T17, dtype=DataType.Float)
    T19 = fd.ops.mul(T16, T18)
    T20 = fd.ops.broadcast_in_dim(T2, shape=[32, 320, 64, 64], broadcast_dims=[1])
    T21 = fd.ops.cast(T20, dtype=DataType.Float)
    T22 = fd.ops.add(T19, T21)
    T23 = fd.ops.cast(T22, dtype=DataType.BFloat16)
    fd.add_output(T23)
    fd.add_output(T6)
    fd.add_output(T11)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((32, 320, 64, 64), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((320,), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((320,), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
