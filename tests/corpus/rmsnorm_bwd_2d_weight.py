# RMSNorm backward with a per-sample (2-D, [batch, hidden]) weight, as adaptive (modulated)
# norms use: x, dy [batch, tokens, hidden] bf16, rstd [batch, tokens] float. dx needs a row
# reduction over hidden; the weight's gradient reduces over the tokens of each sample only.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T3 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T4 = fd.ops.cast(T0, dtype=DataType.Float)
    T5 = fd.ops.cast(T1, dtype=DataType.Float)
    T6 = fd.ops.cast(T2, dtype=DataType.Float)
    T7 = fd.ops.broadcast_in_dim(T6, shape=T0.shape(), broadcast_dims=[0, 2])
    T8 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[0, 1])
    T9 = fd.ops.mul(T5, T7)
    T10 = fd.ops.mul(T4, T8)
    T11 = fd.ops.mul(T9, T10)
    T12 = fd.ops.sum(T11, dims=[2], keepdim=False, dtype=DataType.Null)
    T13 = fd.ops.broadcast_in_dim(T12, shape=T0.shape(), broadcast_dims=[0, 1])
    S14 = fd.define_scalar(0.00048828125, dtype=DataType.Double)
    T15 = fd.ops.mul(T13, S14)
    T16 = fd.ops.mul(T10, T15)
    T17 = fd.ops.sub(T9, T16)
    T18 = fd.ops.mul(T17, T8)
    T19 = fd.ops.cast(T18, dtype=DataType.BFloat16)
    T20 = fd.ops.mul(T5, T10)
    T21 = fd.ops.sum(T20, dims=[1], keepdim=False, dtype=DataType.Null)
    T22 = fd.ops.cast(T21, dtype=DataType.BFloat16)
    fd.add_output(T19)
    fd.add_output(T22)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8, 2048, 2048), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 2048, 2048), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 2048), dtype=torch.bfloat16, device='cuda:0'),
    torch.rand((8, 2048), dtype=torch.float32, device='cuda:0'),
]
fd.execute(inputs)
