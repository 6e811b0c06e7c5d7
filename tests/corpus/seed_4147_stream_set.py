# The single-expression stream lowering example (seed 004_1ba8c9b1fca9b008.txt): T1 = set(T0) with
# T1's outer axis parallelized over CUDA streams. fd.sched.parallelize(..., ParallelType.stream) is the
# way a definition marks a stream-parallel axis.
import torch
from nvfuser import DataType, FusionDefinition, ParallelType


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.ops.set(T0)
    fd.add_output(T1)
    fd.sched.parallelize(T1, 0, ParallelType.stream)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8, 4194304), dtype=torch.float32, device='cuda:0'),
]
fd.execute(inputs)
