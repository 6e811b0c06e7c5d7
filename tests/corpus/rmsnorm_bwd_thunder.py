# RMSNorm backward of a Llama-3-style block as Thunder hands it to fusecut (benchmarks/models.py,
# batch 8, sequence 2048, width 2048, bf16): the two incoming gradients added (T0 + T1), the
# norm's input x (T3), its saved rstd (T4), the residual's gradient (T5); outputs the input's
# gradient (T42, plus the residual gradient) and the weight's (T44, a sum over every row). Rows
# are 4 KiB; five row tensors move, so the inner-outer kernel has to keep four reads in flight.
import torch
from nvfuser import FusionDefinition, DataType

def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T2 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[0])
    T3 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T4 = fd.define_tensor(shape=[-1, -1, 1], contiguity=[True, True, None], dtype=DataType.Float, is_cpu=False, stride_order=[2, 1, 0])
    T5 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T6 = fd.ops.cast(T0, dtype=DataType.Float)
    T7 = fd.ops.cast(T1, dtype=DataType.Float)
    T8 = fd.ops.add(T7, T6)
    T9 = fd.ops.broadcast_in_dim(T2, shape=[8, 2048, 2048], broadcast_dims=[2])
    T10 = fd.ops.cast(T9, dtype=DataType.Float)
    T11 = fd.ops.mul(T10, T8)
    T12 = fd.ops.cast(T3, dtype=DataType.Float)
    T13 = fd.ops.mul(T12, T11)
    T14 = fd.ops.set(T13)
    T15 = fd.ops.sum(T14, dims=[2], keepdim=False)
    T16 = fd.ops.set(T15)
    T17 = fd.ops.broadcast_in_dim(T16, shape=[8, 2048, 1], broadcast_dims=[0, 1])
    S18 = fd.define_scalar(3.0, dtype=DataType.Double)
    T19 = fd.ops.pow(T4, S18)
    S20 = fd.define_scalar(-0.5, dtype=DataType.Double)
    T21 = fd.ops.mul(S20, T17)
    T22 = fd.ops.mul(T21, T19)
    S23 = fd.define_scalar(2048.0, dtype=DataType.Double)
    T24 = fd.ops.div(T22, S23)
    T25 = fd.ops.set(T24)
    T26 = fd.ops.sum(T25, dims=[2], keepdim=False)
    T27 = fd.ops.set(T26)
    T28 = fd.ops.broadcast_in_dim(T27, shape=[8, 2048, 1], broadcast_dims=[0, 1])
    T29 = fd.ops.broadcast_in_dim(T28, shape=[8, 2048, 2048], broadcast_dims=[0, 1, 2])
    S30 = fd.define_scalar(1.0, dtype=DataType.Double)
    T31 = fd.ops.pow(T12, S30)
    S32 = fd.define_scalar(2.0, dtype=DataType.Double)
    T33 = fd.ops.mul(T29, S32)
    T34 = fd.ops.broadcast_in_dim(T4, shape=[8, 2048, 2048], broadcast_dims=[0, 1, 2])
    T35 = fd.ops.mul(T33, T31)
    T36 = fd.ops.mul(T34, T11)
    T37 = fd.ops.add(T36, T35)
    T38 = fd.ops.mul(T12, T34)
    T39 = fd.ops.cast(T5, dtype=DataType.Float)
    T40 = fd.ops.add(T39, T37)
    T41 = fd.ops.mul(T38, T8)
    T42 = fd.ops.cast(T40, dtype=DataType.BFloat16)
    T43 = fd.ops.sum(T41, dims=[0, 1], keepdim=False)
    T44 = fd.ops.cast(T43, dtype=DataType.BFloat16)
    fd.add_output(T42)
    fd.add_output(T44)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((8, 2048, 2048), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 2048, 2048), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((2048,), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 2048, 2048), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 2048, 1), dtype=torch.float32, device='cuda:0'),
    torch.randn((8, 2048, 2048), dtype=torch.bfloat16, device='cuda:0'),
]
fd.execute(inputs)
