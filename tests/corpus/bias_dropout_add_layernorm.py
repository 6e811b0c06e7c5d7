# A transformer block's tail: bias add, dropout (p = 0.1, seeded), residual add, then LayerNorm;
# bf16 in/out, float math. The residual sum is an output (the next block's residual), as are the
# statistics for the backward.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T3 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T4 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    S5 = fd.define_scalar(None, dtype=DataType.Int)
    S6 = fd.define_scalar(None, dtype=DataType.Int)
    T7 = fd.ops.cast(T0, dtype=DataType.Float)
    T8 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[1])
    T9 = fd.ops.cast(T8, dtype=DataType.Float)
    T10 = fd.ops.add(T7, T9)
    S11 = fd.define_scalar(0.00000, dtype=DataType.Double)
    S12 = fd.define_scalar(1.00000, dtype=DataType.Double)
    T13 = fd.ops.uniform(S11, S12, shape=T0.shape(), rng_seed=S5, rng_offset=S6, dtype=DataType.Float)
    S14 = fd.define_scalar(0.900000, dtype=DataType.Double)
    T15 = fd.ops.lt(T13, S14)
    T16 = fd.ops.mul(T10, T15)
    S17 = fd.define_scalar(1.11111, dtype=DataType.Double)
    T18 = fd.ops.mul(T16, S17)
    T19 = fd.ops.cast(T2, dtype=DataType.Float)
    T20 = fd.ops.add(T18, T19)
    T21 = fd.ops.cast(T20, dtype=DataType.BFloat16)
    T22, T23 = fd.ops.var_mean(T20, dims=[1], correction=0, keepdim=False)
    T24 = fd.ops.broadcast_in_dim(T23, shape=T0.shape(), broadcast_dims=[0])
    T25 = fd.ops.sub(T20, T24)
    S26 = fd.define_scalar(1e-05, dtype=DataType.Double)
    T27 = fd.ops.add(T22, S26)
    T28 = fd.ops.rsqrt(T27)
    T29 = fd.ops.broadcast_in_dim(T28, shape=T0.shape(), broadcast_dims=[0])
    T30 = fd.ops.mul(T25, T29)
    T31 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[1])
    T32 = fd.ops.cast(T31, dtype=DataType.Float)
    T33 = fd.ops.mul(T30, T32)
    T34 = fd.ops.broadcast_in_dim(T4, shape=T0.shape(), broadcast_dims=[1])
    T35 = fd.ops.cast(T34, dtype=DataType.Float)
    T36 = fd.ops.add(T33, T35)
    T37 = fd.ops.cast(T36, dtype=DataType.BFloat16)
    fd.add_output(T21)
    fd.add_output(T37)
    fd.add_output(T23)
    fd.add_output(T28)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((16384, 4096), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4096,), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((16384, 4096), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4096,), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4096,), dtype=torch.bfloat16, device='cuda:0'),
    2024,
    0,
]
fd.execute(inputs)
