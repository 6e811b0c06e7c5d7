# x + y.T with y stored untransposed, bf16 in/out: the two inputs disagree on which axis is
# contiguous, so one side is read across its rows unless the kernel tiles the transpose.
import torch
from nvfuser import DataType, FusionDefinition


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, is_cpu=False)
    T2 = fd.ops.permute(T1, dims=[1, 0])
    T3 = fd.ops.cast(T0, dtype=DataType.Float)
    T4 = fd.ops.cast(T2, dtype=DataType.Float)
    T5 = fd.ops.add(T3, T4)
    T6 = fd.ops.cast(T5, dtype=DataType.BFloat16)
    fd.add_output(T6)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8192, 8192), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8192, 8192), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
