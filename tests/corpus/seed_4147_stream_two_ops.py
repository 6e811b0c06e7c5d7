# Two stream-parallel expressions that share the stream axis: the host program should hold them in one
# merged for-loop over the stream index (seed 004_1ba8c9b1fca9b008.txt, "merging of for-loops").
import torch
from nvfuser import DataType, FusionDefinition, ParallelType


def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.ops.add(T0, T0)
    T2 = fd.ops.sum(T1, dims=[1], keepdim=False, dtype=DataType.Float)
    fd.add_output(T1)
    fd.add_output(T2)
    fd.sched.parallelize(T1, 0, ParallelType.stream)
    fd.sched.parallelize(T2, 0, ParallelType.stream)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((16, 2097152), dtype=torch.float32, device='cuda:0'),
]
fd.execute(inputs)
