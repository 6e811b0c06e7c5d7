import torch
from nvfuser import FusionDefinition, DataType

def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T2 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T3 = fd.ops.cast(T0, dtype=DataType.Float)
    T4 = fd.ops.mul(T3, T3)
    T5 = fd.ops.mul(T4, T3)
    S6 = fd.define_scalar(0.044715, dtype=DataType.Double)
    T7 = fd.ops.mul(S6, T5)
    T8 = fd.ops.add(T3, T7)
    S9 = fd.define_scalar(0.5, dtype=DataType.Double)
    T10 = fd.ops.mul(S9, T3)
    S11 = fd.define_scalar(0.7978845608028654, dtype=DataType.Double)
    T12 = fd.ops.mul(S11, T8)
    T13 = fd.ops.cast(T1, dtype=DataType.Float)
    T14 = fd.ops.mul(T10, T13)
    T15 = fd.ops.tanh(T12)
    T16 = fd.ops.mul(T15, T15)
    S17 = fd.define_scalar(1.0, dtype=DataType.Double)
    T18 = fd.ops.sub(S17, T16)
    T19 = fd.ops.mul(T14, T18)
    S20 = fd.define_scalar(1.0, dtype=DataType.Double)
    T21 = fd.ops.add(S20, T15)
    S22 = fd.define_scalar(0.7978845608028654, dtype=DataType.Double)
    T23 = fd.ops.mul(S22, T19)
    T24 = fd.ops.mul(T21, T13)
    S25 = fd.define_scalar(0.044715, dtype=DataType.Double)
    T26 = fd.ops.mul(S25, T23)
    S27 = fd.define_scalar(0.5, dtype=DataType.Double)
    T28 = fd.ops.mul(S27, T24)
    T29 = fd.ops.mul(T3, T26)
    T30 = fd.ops.mul(T4, T26)
    T31 = fd.ops.add(T23, T28)
    T32 = fd.ops.mul(T3, T29)
    T33 = fd.ops.add(T31, T30)
    T34 = fd.ops.add(T33, T32)
    T35 = fd.ops.add(T34, T32)
    T36 = fd.ops.cast(T2, dtype=DataType.Float)
    T37 = fd.ops.cast(T35, dtype=DataType.BFloat16)
    T38 = fd.ops.sum(T36, dims=[0, 1], keepdim=False)
    T39 = fd.ops.cast(T38, dtype=DataType.BFloat16)
    fd.add_output(T37)
    fd.add_output(T39)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8, 2048, 8192), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 2048, 8192), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 2048, 2048), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
