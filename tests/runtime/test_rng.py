"""Random numbers and 8-bit floats without a GPU: Philox known answers, the reference's values,
dropout planned as one kernel, and the generated kernels compiling with NVRTC.

The GPU side (kernel equals reference, statistics, fp8 against torch's casts) is in
tests/runtime/test_rng_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.codegen.rng import PHILOX_ROUNDS
from fusecut.optimizer.errors import DefinitionError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import ScalarMeta, tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin, include_dirs
from fusecut.runtime.philox import philox4x32, random_values
from fusecut.runtime.reference import run_reference
from fusecut.runtime.run import run_plan
from tests.helpers import fusion

# Random123's kat_vectors for philox4x32-10: counter, key, result
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]

DROPOUT = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
S2 = fd.define_scalar(None, dtype=DataType.Int)
T3 = fd.ops.uniform(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float, rng_seed=S1, rng_offset=S2)
T5 = fd.ops.lt(T3, 0.9)
T6 = fd.ops.where(T5, T0, 0.0)
T7 = fd.ops.mul(T6, 1.1111111111111112)
fd.add_output(T7)
"""

SOFTMAX_DROPOUT = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
S2 = fd.define_scalar(None, dtype=DataType.Int)
T1 = fd.ops.max(T0, dims=[1], keepdim=False, dtype=DataType.Null)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[0])
T4 = fd.ops.exp(fd.ops.sub(T0, T2))
T5 = fd.ops.sum(T4, dims=[1], keepdim=False, dtype=DataType.Null)
T7 = fd.ops.div(T4, fd.ops.broadcast_in_dim(T5, shape=T0.shape(), broadcast_dims=[0]))
T8 = fd.ops.uniform(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float, rng_seed=S1, rng_offset=S2)
T10 = fd.ops.where(fd.ops.lt(T8, 0.9), T7, 0.0)
T11 = fd.ops.mul(T10, 1.1111111111111112)
fd.add_output(T11)
"""

# A uniform read on both sides of a forced boundary: each segment recomputes it.
RECOMPUTED = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
T2 = fd.ops.uniform(-1.0, 1.0, shape=T0.shape(), dtype=DataType.Float, rng_seed=S1, rng_offset=5)
T3 = fd.ops.add(T0, T2)
T4 = fd.ops.segment_set(T3)
T5 = fd.ops.mul(T4, T2)
fd.add_output(T5)
"""

FP8 = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float8_e5m2)
T2 = fd.ops.cast(T0, dtype=DataType.Float8_e4m3fn)
T3 = fd.ops.relu(fd.ops.cast(T2, dtype=DataType.Float))
T4 = fd.ops.cast(T0, dtype=DataType.Float8_e5m2)
T5 = fd.ops.add(T1, T1)
T6 = fd.ops.sum(T1, dims=[1], keepdim=False, dtype=DataType.Float)
fd.add_output(T2)
fd.add_output(T3)
fd.add_output(T4)
fd.add_output(T5)
fd.add_output(T6)
"""


def _plan(body: str, shape, *scalars, dtype=DType.float32):
    f = fusion(body)
    metas = [tensor_meta(shape, dtype)] + [ScalarMeta(DType.int64, s) for s in scalars]
    return f, make_plan(f, metas, PlanOptions(time_limit_s=2))


def _compile_all(plan, arch="sm_90") -> list:
    sources = []
    for seg in plan.segments:
        sk = generate_segment(plan, seg)
        if sk.kernels:
            assert len(compile_cubin(sk.source, arch, sk.kernels[0].name)) > 0
            sources.append(sk)
    return sources


def _ptx(source: str) -> str:
    from cuda.bindings import nvrtc

    _, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    opts = [b"-arch=compute_90", b"-std=c++17"] + [b"-I" + d.encode() for d in include_dirs()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    _, size = nvrtc.nvrtcGetPTXSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetPTX(prog, buf)
    return buf.decode()


# ---- Philox and the reference ----------------------------------------------------------------


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_philox4x32_10_known_answers(counter, key, expected):
    words = philox4x32(tuple(torch.tensor([c], dtype=torch.int64) for c in counter), key)
    assert tuple(int(w) for w in words) == expected


def test_values_depend_only_on_seed_offset_and_linear_index():
    f = fusion("""
S0 = fd.define_scalar(None, dtype=DataType.Int)
S1 = fd.define_scalar(None, dtype=DataType.Int)
T2 = fd.ops.uniform(0.0, 1.0, shape=[6, 10], dtype=DataType.Float, rng_seed=S0, rng_offset=S1)
T3 = fd.ops.uniform(0.0, 1.0, shape=[60], dtype=DataType.Float, rng_seed=S0, rng_offset=S1)
T4 = fd.ops.uniform(0.0, 1.0, shape=[37], dtype=DataType.Float, rng_seed=S0, rng_offset=S1)
T5 = fd.ops.uniform(0.0, 1.0, shape=[60], dtype=DataType.Float)
T6 = fd.ops.uniform(0.0, 1.0, shape=[60], dtype=DataType.Float, rng_seed=0, rng_offset=0)
fd.add_output(T2)
fd.add_output(T3)
fd.add_output(T4)
fd.add_output(T5)
fd.add_output(T6)
""")
    t2, t3, t4, t5, t6 = run_reference(f, [11, 3])
    assert torch.equal(t2.reshape(-1), t3)  # row-major linear index, not the shape
    assert torch.equal(t4, t3[:37])  # a longer tensor extends the same stream
    assert torch.equal(t5, t6)  # no seed, no offset: seed 0, offset 0
    again = run_reference(f, [11, 3])
    assert all(torch.equal(a, b) for a, b in zip(again, [t2, t3, t4, t5, t6]))
    other_offset = run_reference(f, [11, 4])[1]
    other_seed = run_reference(f, [12, 3])[1]
    assert (other_offset != t3).all() and (other_seed != t3).all()
    assert len(set(t3.tolist())) == 60


def test_uniform_bounds_and_16_bit_outputs_round_the_float32_values():
    n = 4099
    u = random_values("uniform", n, False, 1, 2, 0.0, 1.0, "cpu")
    assert u.dtype == torch.float32 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert torch.equal(u * 2 ** 24, torch.floor(u * 2 ** 24))  # 24-bit values
    d = random_values("uniform", n, True, 1, 2, -3.0, 5.0, "cpu")
    assert d.dtype == torch.float64 and float(d.min()) >= -3.0 and float(d.max()) < 5.0
    f = fusion("""
T0 = fd.ops.uniform(-2.0, 3.0, shape=[4099], dtype=DataType.BFloat16, rng_seed=1, rng_offset=2)
T1 = fd.ops.uniform(-2.0, 3.0, shape=[4099], dtype=DataType.Float, rng_seed=1, rng_offset=2)
fd.add_output(T0)
fd.add_output(T1)
""")
    bf, fl = run_reference(f, [])
    rounded = fl.to(torch.bfloat16)
    # [lo, hi) in the output type: a value that rounds to hi is lo, as torch's uniform_ gives it
    assert int((rounded == 3.0).sum()) > 0 and float(bf.max()) < 3.0
    assert bf.dtype == torch.bfloat16 and torch.equal(
        bf, torch.where(rounded == 3.0, torch.tensor(-2.0, dtype=torch.bfloat16), rounded))


def test_uniform_never_draws_its_upper_bound_in_any_float_type():
    # nvFuser's test_uniform_range: 2**29 half values reached 1.0 in [-1, 1)
    for dtype, torch_dtype in (("Half", torch.float16), ("BFloat16", torch.bfloat16),
                               ("Float", torch.float32), ("Double", torch.float64)):
        f = fusion(f"""
T0 = fd.ops.uniform(-1.0, 1.0, shape=[262144], dtype=DataType.{dtype}, rng_seed=3,
                    rng_offset=0)
fd.add_output(T0)
""")
        (u,) = run_reference(f, [])
        assert u.dtype == torch_dtype and float(u.max()) < 1.0 and float(u.min()) >= -1.0


@pytest.mark.parametrize("wide", [False, True])
def test_normal_is_box_muller_pairs(wide):
    """Elements 2k and 2k+1 are r cos t and r sin t of one (u1, u2): the same radius."""
    z = random_values("normal", 2000, wide, 5, 0, 0.0, 1.0, "cpu").double()
    r2 = z[0::2] ** 2 + z[1::2] ** 2
    u = random_values("normal", 2000, wide, 5, 0, 0.0, 1.0, "cpu").double()
    assert torch.equal(z, u)
    # r2 = -2 log u1 with u1 in (0, 1]: positive, and its mean is 2 (an exponential)
    assert float(r2.min()) > 0 and abs(float(r2.mean()) - 2.0) < 0.2
    scaled = random_values("normal", 2000, wide, 5, 0, 3.0, 2.0, "cpu").double()
    torch.testing.assert_close(scaled, 3.0 + 2.0 * z, rtol=1e-6, atol=1e-6)


def test_bad_random_ops_are_rejected_with_a_clear_error():
    with pytest.raises(DefinitionError, match="rng_seed S0 must be an integer scalar"):
        fusion("""
S0 = fd.define_scalar(None, dtype=DataType.Double)
T1 = fd.ops.uniform(0.0, 1.0, shape=[4], dtype=DataType.Float, rng_seed=S0, rng_offset=0)
""")
    with pytest.raises(DefinitionError, match="random numbers must be float16, bfloat16"):
        fusion("T1 = fd.ops.normal(0.0, 1.0, shape=[4], dtype=DataType.Int)")


# ---- planning and code generation --------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_dropout_is_one_pointwise_kernel_that_compiles(arch):
    f, plan = _plan(DROPOUT, (64, 256), 7, 0)
    assert [s.kind.value for s in plan.segments] == ["pointwise"]
    (sk,) = _compile_all(plan, arch)
    assert "fc_uniform_f(" in sk.source and "fc_philox" in sk.source
    args = [torch.randn(64, 256), 7, 0]
    torch.testing.assert_close(run_plan(plan, args).outputs[0], run_reference(f, args)[0],
                               rtol=0, atol=0)


def test_lanes_of_a_vector_share_one_philox_block():
    """Four float lanes are one Philox block: the compiler computes it once per vector (each
    Philox4x32-10 evaluation is 2 mul.hi per round)."""
    f, plan = _plan(DROPOUT, (64, 256), 7, 0)
    (seg,) = plan.segments
    sk = generate_segment(plan, seg)
    blocks = sk.notes["vector"] // 4  # a thread takes one vector
    assert _ptx(sk.source).count("mul.hi") == 2 * PHILOX_ROUNDS * blocks


def test_dropout_after_softmax_fuses_into_the_normalization_kernel():
    f, plan = _plan(SOFTMAX_DROPOUT, (32, 1000), 7, 3)
    assert [s.kind.value for s in plan.segments] == ["normalization"]
    _compile_all(plan)
    args = [torch.randn(32, 1000), 7, 3]
    torch.testing.assert_close(run_plan(plan, args).outputs[0], run_reference(f, args)[0])


def test_a_uniform_recomputed_in_two_segments():
    f, plan = _plan(RECOMPUTED, (33, 130), 9)
    uniform = next(i for i, op in enumerate(f.ops) if op.name == "uniform")
    holders = [s for s in plan.segments if uniform in s.schedule.ops]
    assert len(holders) == 2 and all(s.kind.value == "pointwise" for s in holders)
    _compile_all(plan)
    args = [torch.randn(33, 130), 9]
    torch.testing.assert_close(run_plan(plan, args).outputs[0], run_reference(f, args)[0],
                               rtol=0, atol=0)


def test_every_random_dtype_compiles():
    for name in ("uniform", "normal"):
        for dt in ("Half", "BFloat16", "Float", "Double"):
            f = fusion(f"""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.{name}(1.0, 2.0, shape=T0.shape(), dtype=DataType.{dt})
T2 = fd.ops.sum(fd.ops.cast(T1, dtype=DataType.Float), dims=[1], keepdim=False)
fd.add_output(T1)
fd.add_output(T2)
""")
            plan = make_plan(f, [tensor_meta((8, 100), DType.float32)])
            assert all(s.kind.value != "fallback" for s in plan.segments)
            assert _compile_all(plan)


def test_fp8_casts_and_math_run_in_generated_kernels():
    f = fusion(FP8)
    metas = [tensor_meta((64, 64), DType.float32), tensor_meta((64, 64), DType.float8_e5m2)]
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2))
    assert all(s.kind.value not in ("fallback", "library") for s in plan.segments)
    sources = "".join(sk.source for sk in _compile_all(plan, "sm_80"))
    for helper in ("fc_f_to_e4m3", "fc_e4m3_to_f", "fc_f_to_e5m2", "fc_e5m2_to_f"):
        assert helper in sources
    args = [torch.randn(64, 64) * 100, (torch.randn(64, 64) * 10).to(torch.float8_e5m2)]
    for got, want in zip(run_plan(plan, args).outputs, run_reference(f, args), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0)


# ---- unseeded random ops draw from torch's generator (issue 18, item 6) -----------------------

UNSEEDED = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.uniform(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float)
T2 = fd.ops.normal(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float)
T3 = fd.ops.add(T0, T1)
fd.add_output(T3)
fd.add_output(T2)
"""

# Both seeded by hand: what an unseeded pair becomes for one call's (seed, offsets 0 and 1).
SEEDED_BY_HAND = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.define_scalar(None, dtype=DataType.Int)
S2 = fd.define_scalar(None, dtype=DataType.Int)
S3 = fd.define_scalar(None, dtype=DataType.Int)
T1 = fd.ops.uniform(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float, rng_seed=S1, rng_offset=S2)
T2 = fd.ops.normal(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float, rng_seed=S1, rng_offset=S3)
T3 = fd.ops.add(T0, T1)
fd.add_output(T3)
fd.add_output(T2)
"""


def _definition(body: str):
    from fusecut import FusionDefinition

    return FusionDefinition.from_fusion(fusion(body))


def _cpu_seed_after(seed: int) -> int:
    """The 64-bit seed a call draws from the CPU generator right after ``manual_seed(seed)``."""
    torch.manual_seed(seed)
    return int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64))


def test_unseeded_random_ops_differ_on_every_call():
    fd = _definition(UNSEEDED)
    x = torch.zeros(16, 64)
    first, second = fd.execute([x]), fd.execute([x])
    for a, b in zip(first, second):
        assert not torch.equal(a, b)
    assert not torch.equal(first[0], first[1])  # two ops: two offsets, two streams
    assert 0.0 <= float(first[0].min()) and float(first[0].max()) < 1.0


def test_manual_seed_reproduces_unseeded_draws():
    fd = _definition(UNSEEDED)
    x = torch.zeros(16, 64)
    torch.manual_seed(1234)
    run = [fd.execute([x]) for _ in range(2)]
    torch.manual_seed(1234)
    again = [fd.execute([x]) for _ in range(2)]
    for outs, outs_again in zip(run, again):
        assert all(torch.equal(a, b) for a, b in zip(outs, outs_again))
    torch.manual_seed(1235)
    other = fd.execute([x])
    assert not torch.equal(other[0], run[0][0])


def test_each_call_takes_one_seed_from_the_cpu_generator_and_one_offset_per_op():
    """The values are exactly those of the hand-seeded fusion with the seed the generator gives
    and offsets 0, 1; the generator moves on by that one draw."""
    fd = _definition(UNSEEDED)
    x = torch.randn(5, 33)
    seed = _cpu_seed_after(7)
    next_draw = int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64))
    torch.manual_seed(7)
    state = torch.get_rng_state()
    got = fd.execute([x])
    assert not torch.equal(torch.get_rng_state(), state)  # the generator advanced
    want = run_reference(fusion(SEEDED_BY_HAND), [x, seed, 0, 1])
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64)) == next_draw


def test_explicit_seeds_keep_giving_the_same_numbers():
    fd = _definition(SEEDED_BY_HAND)
    x = torch.zeros(8, 16)
    state = torch.get_rng_state()
    a, b = fd.execute([x, 11, 3, 4]), fd.execute([x, 11, 3, 4])
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the generator
    c = fd.execute([x, 11, 5, 4])
    assert not torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])


def test_unseeded_ops_become_run_time_inputs_of_one_plan():
    from fusecut.optimizer.ir.rng import seed_implicit_rng
    from fusecut.runtime.program import baked_positions

    f = fusion(UNSEEDED)
    metas = [tensor_meta((4, 8), DType.float32)]
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2))
    hidden = plan.fusion.implicit_rng
    assert len(hidden) == 3 and plan.fusion.inputs == [*f.inputs, *hidden]  # seed, 2 offsets
    assert not baked_positions(plan.fusion)  # no value of theirs is in a program's signature
    assert seed_implicit_rng(f, metas)[0].inputs == plan.fusion.inputs  # deterministic
    assert f.implicit_rng == () and len(f.inputs) == 1  # the caller's fusion is unchanged
    seeded = fusion(SEEDED_BY_HAND)
    assert seed_implicit_rng(seeded, [metas[0]] + [ScalarMeta(DType.int64)] * 3)[0] is seeded


def test_an_unseeded_uniform_recomputed_in_two_segments_draws_once():
    body = RECOMPUTED.replace("rng_seed=S1, rng_offset=5", "").replace(
        "dtype=DataType.Float, )", "dtype=DataType.Float)")
    f = fusion(body.replace("S1 = fd.define_scalar(None, dtype=DataType.Int)\n", ""))
    x = torch.randn(6, 40)
    plan = make_plan(f, [tensor_meta((6, 40), DType.float32)], PlanOptions(time_limit_s=2))
    assert len(plan.segments) == 2 and all(
        any(plan.fusion.ops[i].name == "uniform" for i in s.schedule.ops) for s in plan.segments)
    seed = _cpu_seed_after(3)
    torch.manual_seed(3)
    (got,) = run_plan(plan, [x]).outputs
    (want,) = run_reference(plan.fusion, [x, seed, 0])
    assert torch.equal(got, want)  # (x + u) * u with one u: both segments drew the same numbers


def test_a_plan_with_unseeded_ops_is_named_by_the_fusion_as_written():
    """The service names a plan before making it (its cache key) and a worker rebuilds it from
    the caller's definition: both see the fusion as written, never its seeded form."""
    from fusecut.optimizer.ir.rng import as_written
    from fusecut.optimizer.ir.wire import fusion_from_json, fusion_id, fusion_to_json, meta_to_json
    from fusecut.optimizer.plan.plan import plan_key
    from fusecut.optimizer.plan.restore import restore_plan
    from fusecut.optimizer.profiles import get_profile

    f = fusion(UNSEEDED)
    metas = [tensor_meta((4, 8), DType.float32)]
    options = PlanOptions(time_limit_s=2)
    plan = make_plan(f, metas, options)
    assert as_written(plan.fusion) == f and plan.fusion_id == fusion_id(f)
    assert plan.plan_id == plan_key(fusion_id(f), [meta_to_json(m) for m in metas],
                                    options.to_json(), get_profile(None, None).to_json())
    for caller in (f, fusion_from_json(fusion_to_json(f))):  # as parsed, as sent on the wire
        restored = restore_plan(caller, metas, plan.to_json())
        assert restored.plan_id == plan.plan_id
        assert restored.fusion.implicit_rng == plan.fusion.implicit_rng


def test_the_service_executes_unseeded_random_ops_with_fresh_draws(tmp_path):
    import httpx

    from fusecut.wire.tensors import dump_safetensors, load_safetensors
    from tests.server import Server

    definition = "def fusion(fd):\n" + "".join(f"    {line}\n"
                                                for line in UNSEEDED.strip().splitlines())
    body = dump_safetensors({"T0": torch.zeros(4, 8)})
    with Server(tmp_path / "plans.sqlite") as s:
        runs = [httpx.post(f"{s.url}/v1/execute", data={"definition": definition}, timeout=60,
                           files={"tensors": ("t.safetensors", body)}) for _ in range(2)]
    assert [r.status_code for r in runs] == [200, 200], runs[0].text
    first, second = (load_safetensors(r.content) for r in runs)
    assert set(first) == {"T3", "T2"}
    assert not torch.equal(first["T3"], second["T3"])  # drawn afresh on every call
    assert 0.0 <= float(first["T3"].min()) and float(first["T3"].max()) < 1.0
