# GELU (tanh approximation) with a bias add, bf16 in/out.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.ops.cast(T0, dtype=DataType.Float)
    T3 = fd.ops.cast(T1, dtype=DataType.Float)
    T4 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[1])
    T5 = fd.ops.add(T2, T4)
    S6 = fd.define_scalar(0.044715, dtype=DataType.Double)
    T7 = fd.ops.mul(T5, T5)
    T8 = fd.ops.mul(T7, T5)
    T9 = fd.ops.mul(T8, S6)
    T10 = fd.ops.add(T5, T9)
    S11 = fd.define_scalar(0.7978845608028654, dtype=DataType.Double)
    T12 = fd.ops.mul(T10, S11)
    T13 = fd.ops.tanh(T12)
    S14 = fd.define_scalar(1.0, dtype=DataType.Double)
    T15 = fd.ops.add(T13, S14)
    S16 = fd.define_scalar(0.5, dtype=DataType.Double)
    T17 = fd.ops.mul(T5, S16)
    T18 = fd.ops.mul(T17, T15)
    T19 = fd.ops.cast(T18, dtype=DataType.BFloat16)
    fd.add_output(T19)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8192, 16384), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((16384,), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
