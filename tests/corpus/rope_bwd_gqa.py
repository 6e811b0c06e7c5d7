# Rotary-embedding (RoPE) backward with grouped-query attention, as Thunder differentiates a
# Llama-3-8B attention block (32 query heads sharing 8 key/value heads, head size 128): the
# gradients of q, k and v arrive per query head [batch, 32, seq, 128] bf16 from the attention
# backward. RoPE's backward (x * cos + rotate_half(x) * sin) is undone with slices, a negation
# and pads; k and v were expanded from 8 to 32 heads, so their gradients sum over the 4 query
# heads of each group (a reshape [batch, 8, 4, seq, 128], then a sum over the group axis).
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True], dtype=DataType.BFloat16, is_cpu=False)
    T3 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T4 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T5 = fd.ops.cast(T3, dtype=DataType.Float)
    T6 = fd.ops.cast(T4, dtype=DataType.Float)
    T7 = fd.ops.broadcast_in_dim(T5, shape=T0.shape(), broadcast_dims=[2, 3])
    T8 = fd.ops.broadcast_in_dim(T6, shape=T0.shape(), broadcast_dims=[2, 3])
    S9 = fd.define_scalar(0.00000, dtype=DataType.Double)
    # dq = g * cos + pad(g * sin [64:], right) - pad(g * sin [:64], left)
    T10 = fd.ops.cast(T0, dtype=DataType.Float)
    T11 = fd.ops.mul(T10, T7)
    T12 = fd.ops.mul(T10, T8)
    T13 = fd.ops.slice(T12, start_indices=[0, 0, 0, 0], end_indices=[4, 32, 2048, 64], strides=[1, 1, 1, 1])
    T14 = fd.ops.slice(T12, start_indices=[0, 0, 0, 64], end_indices=[4, 32, 2048, 128], strides=[1, 1, 1, 1])
    T15 = fd.ops.neg(T13)
    T16 = fd.ops.pad(T15, [64, 0, 0, 0, 0, 0, 0, 0], S9)
    T17 = fd.ops.pad(T14, [0, 64, 0, 0, 0, 0, 0, 0], S9)
    T18 = fd.ops.add(T11, T16)
    T19 = fd.ops.add(T18, T17)
    T20 = fd.ops.cast(T19, dtype=DataType.BFloat16)
    # dk: the same, then summed over the 4 query heads of each key/value head
    T21 = fd.ops.cast(T1, dtype=DataType.Float)
    T22 = fd.ops.mul(T21, T7)
    T23 = fd.ops.mul(T21, T8)
    T24 = fd.ops.slice(T23, start_indices=[0, 0, 0, 0], end_indices=[4, 32, 2048, 64], strides=[1, 1, 1, 1])
    T25 = fd.ops.slice(T23, start_indices=[0, 0, 0, 64], end_indices=[4, 32, 2048, 128], strides=[1, 1, 1, 1])
    T26 = fd.ops.neg(T24)
    T27 = fd.ops.pad(T26, [64, 0, 0, 0, 0, 0, 0, 0], S9)
    T28 = fd.ops.pad(T25, [0, 64, 0, 0, 0, 0, 0, 0], S9)
    T29 = fd.ops.add(T22, T27)
    T30 = fd.ops.add(T29, T28)
    T31 = fd.ops.reshape(T30, new_shape=[4, 8, 4, 2048, 128])
    T32 = fd.ops.sum(T31, dims=[2], keepdim=False, dtype=DataType.Null)
    T33 = fd.ops.cast(T32, dtype=DataType.BFloat16)
    # dv: summed over the group only
    T34 = fd.ops.cast(T2, dtype=DataType.Float)
    T35 = fd.ops.reshape(T34, new_shape=[4, 8, 4, 2048, 128])
    T36 = fd.ops.sum(T35, dims=[2], keepdim=False, dtype=DataType.Null)
    T37 = fd.ops.cast(T36, dtype=DataType.BFloat16)
    fd.add_output(T20)
    fd.add_output(T33)
    fd.add_output(T37)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((4, 32, 2048, 128), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4, 32, 2048, 128), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4, 32, 2048, 128), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((2048, 128), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((2048, 128), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
