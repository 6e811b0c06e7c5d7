"""Every access of a generated kernel stays inside its tensor.

A segment may compute outputs of different extents over one domain (the q heads of a RoPE
backward beside the fewer k heads): the shorter outputs' stores are guarded, yet the loads that
feed them run for every thread. Such a read past the end of a tensor computes nothing anyone
keeps, so no comparison of results sees it, and on the GPU it faults only when the tensor ends
an allocation: ``rope_bwd_interleaved_thunder`` ran for a day before an illegal address. Here
each host-runnable kernel of every corpus case (``tests.host_kernels``) runs under
AddressSanitizer over buffers of exactly its tensors' sizes.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from fusecut.codegen import generate_segment
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.reference import run_reference
from tests.codegen.index_text import parse_index
from tests.conftest import CORPUS_FILES
from tests.corpus_torch import small_definition
from tests.helpers import fusion, small_metas
from tests.host_kernels import host_runnable, out_of_bounds_on_host, run_on_host
from tests.strategies import fusions


def storage_bytes(bound, t: str) -> int:
    """The bytes tensor t spans: an input's strides as given (stride 0 takes none), else
    compact."""
    meta = bound.inputs.get(t)
    if meta is None or not hasattr(meta, "strides"):
        return bound.nbytes(t)
    if 0 in meta.shape:
        return 0
    span = 1 + sum((n - 1) * s for n, s in zip(meta.shape, meta.strides))
    return span * bound.fusion.tensors[t].dtype.itemsize


def assert_inside(plan, sk, kernel, workdir) -> None:
    """Kernel ``kernel`` of ``sk`` reads and writes only inside its tensors (AddressSanitizer)."""
    nbytes = {p.name: storage_bytes(plan.bound, p.name) for p in kernel.params
              if p.kind != "extent"}
    report = out_of_bounds_on_host(sk, nbytes, workdir, kernel.name)
    assert report == "", f"{kernel.name}:\n{report}"


def one_kernel_checked(f, metas, args, workdir):
    """The plan of ``f`` (one segment, one kernel), checked inside its tensors, and its
    outputs computed on the host, each beside the reference's."""
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2))
    (seg,) = plan.segments
    sk = generate_segment(plan, seg)
    assert_inside(plan, sk, sk.kernels[0], workdir)
    outs = {t: torch.empty(plan.bound.shapes[t]) for t in f.outputs}
    run_on_host(sk, dict(zip(f.inputs, args)) | outs, workdir)
    return plan, list(zip(outs.values(), run_reference(f, args)))


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_kernels_read_and_write_inside_their_tensors(path, tmp_path):
    parsed = parse_text(small_definition(path.read_text(), path.stem))
    plan = make_plan(parsed.fusion, small_metas(parsed, 1 << 12), PlanOptions(time_limit_s=2))
    kernels = [(sk, k) for sk in (generate_segment(plan, s) for s in plan.segments)
               for k in sk.kernels if host_runnable(sk, k.name)
               and math.prod(k.grid) * math.prod(k.block) <= 1 << 18]
    if not kernels:  # said, not passed: these kernels share memory or shuffle within warps
        pytest.skip("no kernel of this case runs thread by thread on the host")
    for sk, kernel in kernels:
        assert_inside(plan, sk, kernel, tmp_path)


SIDE_BY_SIDE = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.mul(T0, 2.0)
T3 = fd.ops.add(T1, 1.0)
fd.add_output(T2)
fd.add_output(T3)
"""


@pytest.mark.parametrize("short", [(4, 8), (2, 16), (2, 8)], ids=["lanes", "rows", "both"])
def test_an_output_shorter_than_the_domain_reads_only_inside_its_input(short, tmp_path):
    """T3 over a [4, 16] domain: its input's threads past the end (rows, or the lanes of the
    vectors) load nothing, and the values equal the reference."""
    metas = [tensor_meta((4, 16), DType.float32), tensor_meta(short, DType.float32)]
    plan, results = one_kernel_checked(fusion(SIDE_BY_SIDE), metas,
                                       [torch.randn(4, 16), torch.randn(*short)], tmp_path)
    assert plan.segments[0].schedule.domain == (4, 16) and plan.bound.shapes["T3"] == short
    assert all(torch.equal(got, want) for got, want in results)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=fusions(max_ops=8))
def test_generated_pointwise_kernels_stay_inside_their_tensors(drawn, tmp_path_factory):
    plan = make_plan(drawn.fusion, drawn.inputs, PlanOptions(time_limit_s=2))
    workdir = tmp_path_factory.mktemp("asan")
    for seg in plan.segments:
        sk = generate_segment(plan, seg)
        for kernel in sk.kernels:
            if host_runnable(sk, kernel.name):
                assert_inside(plan, sk, kernel, workdir)


SLICE_WRITTEN_OUT = """
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T1 = fd.ops.neg(T0)
T2 = fd.ops.slice(T0, start_indices=[START], end_indices=[3])
fd.add_output(T1)
fd.add_output(T2)
"""


@pytest.mark.parametrize("start", [1, 2, 3])
def test_a_slice_written_out_beside_its_source_reads_inside_it(start, tmp_path):
    """The slice's store is guarded to its extent; its load ``in_T0[start + x0]`` is too."""
    f = fusion(SLICE_WRITTEN_OUT.replace("START", str(start)))
    _, results = one_kernel_checked(f, [tensor_meta((3,), DType.float32)], [torch.randn(3)],
                                    tmp_path)
    assert [got.shape[0] for got, _ in results] == [3, 3 - start]
    assert all(torch.equal(got, want) for got, want in results)


def test_index_ranges_follow_integer_arithmetic():
    from fusecut.codegen.bounds import in_bounds, index_range
    from fusecut.codegen.index import Data

    ranges = {"x0": (0, 7, 1), "x1": (0, 1016, 8), "_lane": (0, 7, 1)}

    def span(text):
        return index_range(parse_index(text), ranges)

    def conds(text, extent):
        return [str(c) for c in in_bounds(parse_index(text), extent, ranges)]

    assert span("(x1 + _lane)") == (0, 1023)
    assert span("((x1 + _lane) / 2) * 2 + 1") == (1, 1023)
    assert span("((x1 % 128) + _lane)") == (0, 127)  # x1 starts a vector
    assert span("((x1 % 60) + _lane)") == (0, 66)  # 60-wide heads split them
    assert span("x1 % 4") == (0, 0)
    assert span("(x0 - 64)") == (-64, -57)
    assert span("x0 * 4 + x0 % 3") == (0, 30)
    assert span("x0 % 200") == (0, 7)  # one period: the values themselves
    assert span("0 - x0") == (-7, 0)
    for opaque in ("fc_clampi<int>((x1 - 64), 56)", "x9 + 1", "x0 / x1", "(int)(x0)"):
        assert span(opaque) is None
    assert index_range(Data("in_T3[x0]", frozenset({"x0"})), ranges) is None  # data: unknown
    assert conds("(2 + x0)", 8) == ["(2 + x0) < 8"]
    assert conds("(x0 - 1)", 8) == ["(x0 - 1) >= 0"]
    assert conds("x0", 8) == [] and conds("fc_clampi<int>(x0, 3)", 4) == []
