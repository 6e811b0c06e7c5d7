# LayerNorm backward: row reductions for the input gradient and column reductions for the weight and
# bias gradients over the same tensors (the "inner-outer" pattern).
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float, is_cpu=False)
    T3 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float, is_cpu=False)
    T4 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T5 = fd.ops.cast(T0, dtype=DataType.Float)
    T6 = fd.ops.cast(T1, dtype=DataType.Float)
    T7 = fd.ops.cast(T4, dtype=DataType.Float)
    T8 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[0, 1])
    T9 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[0, 1])
    T10 = fd.ops.sub(T5, T8)
    T11 = fd.ops.mul(T10, T9)
    T12 = fd.ops.broadcast_in_dim(T7, shape=T0.shape(), broadcast_dims=[1])
    T13 = fd.ops.mul(T6, T12)
    T14 = fd.ops.sum(T13, dims=[1], keepdim=False, dtype=DataType.Null)
    T15 = fd.ops.broadcast_in_dim(T14, shape=T0.shape(), broadcast_dims=[0])
    T16 = fd.ops.mul(T13, T11)
    T17 = fd.ops.sum(T16, dims=[1], keepdim=False, dtype=DataType.Null)
    T18 = fd.ops.broadcast_in_dim(T17, shape=T0.shape(), broadcast_dims=[0])
    S19 = fd.define_scalar(4096.0, dtype=DataType.Double)
    T20 = fd.ops.mul(T13, S19)
    T21 = fd.ops.sub(T20, T15)
    T22 = fd.ops.mul(T11, T18)
    T23 = fd.ops.sub(T21, T22)
    S24 = fd.ops.reciprocal(S19)
    T25 = fd.ops.mul(T9, S24)
    T26 = fd.ops.mul(T25, T23)
    T27 = fd.ops.cast(T26, dtype=DataType.BFloat16)
    T28 = fd.ops.mul(T6, T11)
    T29 = fd.ops.sum(T28, dims=[0], keepdim=False, dtype=DataType.Null)
    T30 = fd.ops.cast(T29, dtype=DataType.BFloat16)
    T31 = fd.ops.sum(T6, dims=[0], keepdim=False, dtype=DataType.Null)
    T32 = fd.ops.cast(T31, dtype=DataType.BFloat16)
    fd.add_output(T27)
    fd.add_output(T30)
    fd.add_output(T32)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((32768, 4096), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((32768, 4096), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((32768, 1), dtype=torch.float32, device='cuda:0'),
    torch.rand((32768, 1), dtype=torch.float32, device='cuda:0'),
    torch.randn((4096,), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
