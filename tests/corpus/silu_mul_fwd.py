# SwiGLU gate: silu(a) * b, bf16 in/out.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.ops.cast(T0, dtype=DataType.Float)
    T3 = fd.ops.neg(T2)
    T4 = fd.ops.exp(T3)
    S5 = fd.define_scalar(1.0, dtype=DataType.Double)
    T6 = fd.ops.add(S5, T4)
    T7 = fd.ops.reciprocal(T6)
    T8 = fd.ops.mul(T2, T7)
    T9 = fd.ops.cast(T1, dtype=DataType.Float)
    T10 = fd.ops.mul(T8, T9)
    T11 = fd.ops.cast(T10, dtype=DataType.BFloat16)
    fd.add_output(T11)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8192, 14336), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8192, 14336), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
