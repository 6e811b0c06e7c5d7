# A transformer MLP: linear -> bias + GELU -> linear. The matrix products belong to a library
# segment; the pointwise work between them should run as one kernel.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False)
    T3 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T4 = fd.ops.linear(T0, T1)
    T5 = fd.ops.cast(T4, dtype=DataType.Float)
    T6 = fd.ops.cast(T2, dtype=DataType.Float)
    T7 = fd.ops.broadcast_in_dim(T6, shape=[T0.size(0), T1.size(0)], broadcast_dims=[1])
    T8 = fd.ops.add(T5, T7)
    S9 = fd.define_scalar(0.7071067811865476, dtype=DataType.Double)
    T10 = fd.ops.mul(T8, S9)
    T11 = fd.ops.erf(T10)
    S12 = fd.define_scalar(1.0, dtype=DataType.Double)
    T13 = fd.ops.add(T11, S12)
    S14 = fd.define_scalar(0.5, dtype=DataType.Double)
    T15 = fd.ops.mul(T8, S14)
    T16 = fd.ops.mul(T15, T13)
    T17 = fd.ops.cast(T16, dtype=DataType.BFloat16)
    T18 = fd.ops.linear(T17, T3)
    fd.add_output(T18)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((2048, 1024), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4096, 1024), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((4096,), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((1024, 4096), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
