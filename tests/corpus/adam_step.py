# One Adam step on a flat float32 parameter: three outputs from four inputs, all pointwise.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False)
    T2 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False)
    T3 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False)
    S4 = fd.define_scalar(0.9, dtype=DataType.Double)
    S5 = fd.define_scalar(0.1, dtype=DataType.Double)
    S6 = fd.define_scalar(0.999, dtype=DataType.Double)
    S7 = fd.define_scalar(0.001, dtype=DataType.Double)
    S8 = fd.define_scalar(1e-08, dtype=DataType.Double)
    S9 = fd.define_scalar(0.0003, dtype=DataType.Double)
    T10 = fd.ops.mul(T2, S4)
    T11 = fd.ops.mul(T1, S5)
    T12 = fd.ops.add(T10, T11)
    T13 = fd.ops.mul(T3, S6)
    T14 = fd.ops.mul(T1, T1)
    T15 = fd.ops.mul(T14, S7)
    T16 = fd.ops.add(T13, T15)
    T17 = fd.ops.sqrt(T16)
    T18 = fd.ops.add(T17, S8)
    T19 = fd.ops.div(T12, T18)
    T20 = fd.ops.mul(T19, S9)
    T21 = fd.ops.sub(T0, T20)
    fd.add_output(T21)
    fd.add_output(T12)
    fd.add_output(T16)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((67108864,), dtype=torch.float32, device='cuda:0'),
    torch.randn((67108864,), dtype=torch.float32, device='cuda:0'),
    torch.randn((67108864,), dtype=torch.float32, device='cuda:0'),
    torch.rand((67108864,), dtype=torch.float32, device='cuda:0'),
]
fd.execute(inputs)
