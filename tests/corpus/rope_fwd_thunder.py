# Rotary-embedding (RoPE) forward with grouped-query attention, the region Thunder hands fusecut
# for a Llama-3-style block (benchmarks/models.py: batch 8, sequence 2048, width 2048, 128-wide
# heads, 16 query heads sharing 8 key/value heads, bf16). From the q, k and v projections it
# rotates q and k (x * cos + rotate_half(x) * sin, rotate_half being a cat of the negated upper
# half and the lower half of each head, both slices of the head axis), scales both by
# 128 ** -0.25, repeats k's and v's 8 heads to 16 (broadcast + reshape) and lays k out
# transposed for the attention's q @ k^T. The slices start at 0 and 64 and the cat joins two
# 64-wide pieces: every piece boundary on the innermost axis is a multiple of the vector width.
import torch
from nvfuser import FusionDefinition, DataType

def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T2 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[3, 2, 1, 0])
    T4 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False, stride_order=[1, 0])
    T5 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[3, 2, 1, 0])
    T3 = fd.ops.permute(T2, dims=[0, 2, 1, 3])
    T6 = fd.ops.permute(T5, dims=[0, 2, 1, 3])
    T7 = fd.ops.reshape(T0, new_shape=[8, 2048, 8, 128])
    T8 = fd.ops.permute(T7, dims=[0, 2, 1, 3])
    T9 = fd.ops.broadcast_in_dim(T1, shape=[8, 16, 2048, 128], broadcast_dims=[2, 3])
    T10 = fd.ops.cast(T3, dtype=DataType.Float)
    T11 = fd.ops.mul(T10, T9)
    T12 = fd.ops.slice(T3, start_indices=[0, 0, 0, 64], end_indices=[8, 16, 2048, 128], strides=[1, 1, 1, 1], manual_normalization=False)
    T13 = fd.ops.cast(T12, dtype=DataType.Float)
    T14 = fd.ops.neg(T13)
    T15 = fd.ops.cast(T14, dtype=DataType.BFloat16)
    T16 = fd.ops.slice(T3, start_indices=[0, 0, 0, 0], end_indices=[8, 16, 2048, 64], strides=[1, 1, 1, 1], manual_normalization=False)
    T17 = fd.ops.cat([T15, T16], dim=-1, manual_padding=False)
    T18 = fd.ops.broadcast_in_dim(T4, shape=[8, 16, 2048, 128], broadcast_dims=[2, 3])
    T19 = fd.ops.cast(T17, dtype=DataType.Float)
    T20 = fd.ops.mul(T19, T18)
    T21 = fd.ops.add(T11, T20)
    T22 = fd.ops.broadcast_in_dim(T1, shape=[8, 8, 2048, 128], broadcast_dims=[2, 3])
    T23 = fd.ops.cast(T6, dtype=DataType.Float)
    T24 = fd.ops.mul(T23, T22)
    T25 = fd.ops.slice(T6, start_indices=[0, 0, 0, 64], end_indices=[8, 8, 2048, 128], strides=[1, 1, 1, 1], manual_normalization=False)
    T26 = fd.ops.cast(T25, dtype=DataType.Float)
    T27 = fd.ops.neg(T26)
    T28 = fd.ops.cast(T27, dtype=DataType.BFloat16)
    T29 = fd.ops.slice(T6, start_indices=[0, 0, 0, 0], end_indices=[8, 8, 2048, 64], strides=[1, 1, 1, 1], manual_normalization=False)
    T30 = fd.ops.cat([T28, T29], dim=-1, manual_padding=False)
    T31 = fd.ops.broadcast_in_dim(T4, shape=[8, 8, 2048, 128], broadcast_dims=[2, 3])
    T32 = fd.ops.cast(T30, dtype=DataType.Float)
    T33 = fd.ops.mul(T32, T31)
    T34 = fd.ops.add(T24, T33)
    T35 = fd.ops.cast(T34, dtype=DataType.BFloat16)
    T36 = fd.ops.broadcast_in_dim(T35, shape=[8, 8, 1, 2048, 128], broadcast_dims=[0, 1, 3, 4])
    T37 = fd.ops.broadcast_in_dim(T36, shape=[8, 8, 2, 2048, 128], broadcast_dims=[0, 1, 2, 3, 4])
    T38 = fd.ops.reshape(T37, new_shape=[8, 16, 2048, 128])
    T39 = fd.ops.broadcast_in_dim(T8, shape=[8, 8, 1, 2048, 128], broadcast_dims=[0, 1, 3, 4])
    T40 = fd.ops.broadcast_in_dim(T39, shape=[8, 8, 2, 2048, 128], broadcast_dims=[0, 1, 2, 3, 4])
    T41 = fd.ops.reshape(T40, new_shape=[8, 16, 2048, 128])
    S42 = fd.define_scalar(0.29730177875068026, dtype=DataType.Double)
    T43 = fd.ops.mul(T21, S42)
    T44 = fd.ops.cast(T43, dtype=DataType.BFloat16)
    T45 = fd.ops.permute(T38, dims=[0, 1, 3, 2])
    T46 = fd.ops.cast(T45, dtype=DataType.Float)
    S47 = fd.define_scalar(0.29730177875068026, dtype=DataType.Double)
    T48 = fd.ops.mul(T46, S47)
    T49 = fd.ops.cast(T48, dtype=DataType.BFloat16)
    T50 = fd.ops.permute(T41, dims=[0, 2, 1, 3])
    T51 = fd.ops.permute(T44, dims=[0, 2, 1, 3])
    T52 = fd.ops.permute(T49, dims=[0, 2, 1, 3])
    fd.add_output(T50)
    fd.add_output(T51)
    fd.add_output(T52)


with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8, 2048, 1024), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((2048, 128), dtype=torch.float32, device='cuda:0'),
    torch.randn((8, 2048, 16, 128), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((2048, 128), dtype=torch.float32, device='cuda:0'),
    torch.randn((8, 2048, 8, 128), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
