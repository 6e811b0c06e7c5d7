# A definition in the form nvFuser prints Thunder's fusions (not from the corpus).
from nvfuser import FusionDefinition, DataType
def nvfuser_fusion_id7(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16, is_cpu=False, stride_order=[2, 1, 0])
    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int, is_cpu=False, stride_order=[0])
    T2 = fd.ops.slice(T0, start_indices=[0, 0, 0], end_indices=[2, 4, 8], strides=[1, 1, 2])
    T3 = fd.ops.pad(T2, [1, 1, 0, 0], None)
    T4 = fd.ops.permute(T3, dims=[2, 0, 1])
    T5 = fd.ops.cat([T4, T4], dim=0, manual_padding=False)
    S6 = fd.ops.size(T5, dim=0)
    T7 = fd.ops.iota(S6, dtype=DataType.Int)
    T8 = fd.ops.index_select(T0, T1, dim=0)
    T9 = fd.ops.full(shape=[T0.size(0), 4], fill_value=0.0, dtype=DataType.Float)
    T10 = fd.ops.take_along_axis(T5, fd.ops.broadcast_in_dim(fd.ops.cast(T7, dtype=DataType.Int), shape=T5.shape(), broadcast_dims=[0]), 0)
    fd.add_output(T10)
    fd.add_output(T8)
    fd.add_output(T9)
