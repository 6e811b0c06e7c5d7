"""Lane maps (``codegen.lanes``): an interleaved RoPE (llama2's ``view_as_complex`` form) reads
each pair of elements of its own vector; the pointwise kernel reads the vector once and picks
each lane's element by a constant map, and computes what the reference computes."""

from __future__ import annotations

import re

import torch

from fusecut.codegen import generate_segment
from fusecut.codegen.lanes import lane_map
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import to_torch_dtype
from tests.codegen.index_text import parse_index
from tests.host_kernels import run_on_host

# q of shape (b, s, h, d) = (2, 8, 4, 16), rotated as complex pairs (d/2 of them) by cos/sin
INTERLEAVED_ROPE = """
import torch
from nvfuser import FusionDefinition, DataType

def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True],
                          dtype=DataType.BFloat16)
    T3 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    T4 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    T5 = fd.ops.reshape(T0, new_shape=[2, 8, 4, 16])
    T8 = fd.ops.cast(T5, dtype=DataType.Float)
    T9 = fd.ops.reshape(T8, new_shape=[2, 8, 4, 8, 2])
    T10 = fd.ops.slice(T9, start_indices=[0, 0, 0, 0, 0], end_indices=[2, 8, 4, 8, 1])
    T11 = fd.ops.slice(T9, start_indices=[0, 0, 0, 0, 1], end_indices=[2, 8, 4, 8, 2])
    T12 = fd.ops.squeeze(T10, dims=[4])
    T13 = fd.ops.squeeze(T11, dims=[4])
    T20 = fd.ops.reshape(T3, new_shape=[1, 8, 1, 8])
    T21 = fd.ops.reshape(T4, new_shape=[1, 8, 1, 8])
    T22 = fd.ops.broadcast_in_dim(T20, shape=[2, 8, 4, 8], broadcast_dims=[0, 1, 2, 3])
    T24 = fd.ops.broadcast_in_dim(T21, shape=[2, 8, 4, 8], broadcast_dims=[0, 1, 2, 3])
    T23 = fd.ops.mul(T12, T22)
    T25 = fd.ops.mul(T13, T24)
    T26 = fd.ops.sub(T23, T25)
    T27 = fd.ops.mul(T12, T24)
    T28 = fd.ops.mul(T13, T22)
    T29 = fd.ops.add(T27, T28)
    T38 = fd.ops.broadcast_in_dim(T26, shape=[2, 8, 4, 8, 1], broadcast_dims=[0, 1, 2, 3])
    T39 = fd.ops.broadcast_in_dim(T29, shape=[2, 8, 4, 8, 1], broadcast_dims=[0, 1, 2, 3])
    T40 = fd.ops.cat([T38, T39], dim=-1)
    T41 = fd.ops.reshape(T40, new_shape=[2, 8, 4, 16])
    T46 = fd.ops.cast(T41, dtype=DataType.BFloat16)
    fd.add_output(T46)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((2, 8, 64), dtype=torch.bfloat16, device='cuda:0'),
    torch.randn((8, 8), dtype=torch.float32, device='cuda:0'),
    torch.randn((8, 8), dtype=torch.float32, device='cuda:0'),
]
"""


def test_lane_map_follows_pairs_and_rejects_what_leaves_the_vector():
    def lanes(text):
        return lane_map(parse_index(text), "x3", 8)

    odd = lanes("(((x3 + _lane) / 2) * 2 + (1 + 0))")
    assert (str(odd.start), odd.offsets) == ("((((x3 + 0) / 2) * 2 + (1 + 0)) - 1)",
                                             (1, 1, 3, 3, 5, 5, 7, 7))
    even = lanes("(((x3 + _lane) / 2) * 2)")
    assert even.offsets == (0, 0, 2, 2, 4, 4, 6, 6) and even.values == odd.values  # one vector
    merged = lanes("(x2 * 16 + (((x3 + _lane) / 2) * 2))")
    assert (str(merged.start), merged.offsets) == ("(x2 * 16 + (((x3 + 0) / 2) * 2))",
                                                   even.offsets)
    assert lanes("(x3 + _lane)").offsets == tuple(range(8))
    assert lanes("(((x3 + _lane) / 2) * 2 + 2)") is None  # lane 7 reads x3 + 8
    assert lanes("((x3 + _lane) / 2)") is None  # half the rate: another vector
    assert lanes("(((x3 + _lane) / 3) * 3)") is None  # 3 does not divide 8
    assert lanes("(x3 * _lane)") is None
    assert lanes("(x2 * 4 + (((x3 + _lane) / 2) * 2))") is None  # x2 = 1: misaligned
    assert lanes("(((x2 + x3 + _lane) / 2) * 2)") is None  # x2's parity moves the pairs
    assert lanes("fc_clampi<int>((x3 + _lane), 7)") is None


def test_interleaved_rope_reads_whole_vectors_and_equals_the_reference(tmp_path):
    parsed = parse_text(INTERLEAVED_ROPE)
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    [seg] = plan.segments
    sk = generate_segment(plan, seg)
    code = sk.source.split("fusecut_segment0_pointwise(", 1)[1]
    maps = re.findall(r"constexpr int \w+\[8\] = \{([\d, ]+)\};", code)
    assert sorted(maps) == ["0, 0, 2, 2, 4, 4, 6, 6", "1, 1, 3, 3, 5, 5, 7, 7"]
    assert re.search(r"\bin_T0\[", code) is None  # q only as whole vectors
    assert code.count("reinterpret_cast<const fc_vec<__nv_bfloat16, 8>*>(in_T0") == 1
    compile_cubin(sk.source, "sm_90", "fusecut_segment0_pointwise")
    torch.manual_seed(0)
    inputs = [torch.randn(m.shape).to(to_torch_dtype(m.dtype)) for m in parsed.inputs]
    [out] = parsed.fusion.outputs
    got = torch.empty(plan.bound.shapes[out], dtype=torch.bfloat16)
    run_on_host(sk, dict(zip(parsed.fusion.inputs, inputs)) | {out: got}, tmp_path)
    torch.testing.assert_close(got, run_reference(parsed.fusion, inputs)[0].contiguous(),
                               rtol=0, atol=0)
