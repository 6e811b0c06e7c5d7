"""nvFuser's library-like ops: attention, embedding, scatter, sorting, grouped matmul, block
quantization.

None of them has a generated kernel. Attention and grouped matmul are LIBRARY ops (one op per
segment, as cuBLAS/cuDNN calls would be); the rest are FALLBACK ops (one op per segment through the
torch reference). Their signatures follow nvFuser's direct frontend (python/python_direct/ops.cpp
at NVIDIA/Fuser 81c4b22), their results its shape rules (csrc/ops/composite.cpp, arith.cpp,
indexing.cpp). The torch implementations live in ``runtime.reference_library``.
"""

from __future__ import annotations

from fusecut.optimizer.errors import DefinitionError, InputError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import TensorValue
from fusecut.optimizer.ir.opspec import (
    OPERAND_KINDS,
    OpClass,
    OpSpec,
    OutSig,
    Param,
    broadcast_shapes,
    check_extent,
    get_spec,
    norm_axis,
    register,
)

# Library calls whatever their dtypes (attention's rng state is uint64, NVFP4 operands are fp4):
# each is one segment of kind library, run through torch.
LIBRARY_CALLS = frozenset({"sdpfa_fwd", "sdpfa_bwd", "grouped_mm", "cutlass_nvfp4_grouped_mm"})
# dtype of nv_block_quantize's scales for each quantized dtype, and the block size nvFuser requires
BLOCK_QUANTIZE = {DType.float4_e2m1fn: (DType.float8_e4m3fn, 16),
                  DType.float8_e4m3fn: (DType.float8_e8m0fnu, 32)}


def _tensor(v, op: str, what: str) -> TensorValue:
    if not isinstance(v, TensorValue):
        raise DefinitionError(f"{op}: {what} must be a tensor, {v.name} is a scalar")
    return v


def _operands(ins, attrs, op: str) -> dict[str, TensorValue]:
    """The tensor operands by parameter name (absent optional ones left out), in the order of the
    op's parameters; scalar operands are skipped."""
    out = {}
    values = iter(ins)
    for p in get_spec(op).params:
        if p.kind in OPERAND_KINDS and attrs.get(f"has_{p.name}", True):
            v = next(values)
            if p.kind in ("T", "T?"):
                out[p.name] = _tensor(v, op, p.name)
    return out


def _dense(rank: int) -> tuple[bool, ...]:
    return tuple(False for _ in range(rank))


def _flags_and(*tensors: TensorValue, axes: range) -> tuple[bool, ...]:
    return tuple(all(t.broadcast[a] for t in tensors) for a in axes)


# ---- scaled dot-product flash attention --------------------------------------------------------
# query [N*, H, L, E], key [N*, H, S, E], value [N*, H, S, Ev] -> output [N*, H, L, Ev] (query's
# dtype), logsumexp [N*, H, L] (float32), philox_seed [2] and philox_offset [] (uint64: torch
# >= 2.7's rng state, as nvFuser builds against it).

def _sdpa_check(q: TensorValue, k: TensorValue, v: TensorValue, op: str) -> None:
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_float:
        raise DefinitionError(f"{op}: query, key and value must share a floating-point dtype, got "
                              f"{q.dtype.value}, {k.dtype.value}, {v.dtype.value}")
    if not (q.rank == k.rank == v.rank) or q.rank < 4:
        raise DefinitionError(f"{op}: query, key and value must have the same rank >= 4, got "
                              f"{q.rank}, {k.rank}, {v.rank}")


def _sdpa_fwd_infer(ins, attrs):
    t = _operands(ins, attrs, "sdpfa_fwd")
    q, k, v = t["query"], t["key"], t["value"]
    _sdpa_check(q, k, v, "sdpfa_fwd")
    if "bias" in t and (t["bias"].rank != q.rank or t["bias"].dtype != q.dtype):
        raise DefinitionError(f"sdpfa_fwd: bias must have query's rank and dtype ({q.rank}, "
                              f"{q.dtype.value})")
    if "mask" in t and (t["mask"].rank != q.rank or not t["mask"].dtype.is_bool):
        raise DefinitionError(f"sdpfa_fwd: mask must be a bool tensor of rank {q.rank}")
    batch = _flags_and(q, k, v, axes=range(q.rank - 2))
    return [OutSig(q.dtype, batch + (q.broadcast[-2], v.broadcast[-1])),
            OutSig(DType.float32, batch + (q.broadcast[-2],)),
            OutSig(DType.uint64, (False,)), OutSig(DType.uint64, ())]


def sdpa_out_shape(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> tuple[int, ...]:
    if q[-1] != k[-1] or k[-2] != v[-2]:
        raise InputError(f"sdpfa: query {list(q)}, key {list(k)} and value {list(v)} do not fit "
                         f"(query and key share E, key and value share S)")
    batch = broadcast_shapes([q[:-2], k[:-2], v[:-2]], ["query", "key", "value"])
    return batch + (q[-2], v[-1])


def _sdpa_fwd_shape(in_shapes, attrs, ev):
    q, k, v = in_shapes[:3]
    out = sdpa_out_shape(q, k, v)
    return [out, out[:-1], (2,), ()]


register(OpSpec("sdpfa_fwd", (Param("query", "T"), Param("key", "T"), Param("value", "T"),
                              Param("bias", "T?", None), Param("mask", "T?", None),
                              Param("dropout_p", "S?", None), Param("is_causal", "S?", None),
                              Param("scale", "S?", None)),
                OpClass.LIBRARY, _sdpa_fwd_infer, _sdpa_fwd_shape, n_outputs=4, cost=0))

def _sdpa_bwd_infer(ins, attrs):
    t = _operands(ins, attrs, "sdpfa_bwd")
    q, k, v = t["query"], t["key"], t["value"]
    _sdpa_check(q, k, v, "sdpfa_bwd")
    for name in ("grad_output", "output"):
        if t[name].dtype != q.dtype or t[name].rank != q.rank:
            raise DefinitionError(f"sdpfa_bwd: {name} must have query's dtype and rank")
    if t["logsumexp"].rank != q.rank - 1:
        raise DefinitionError(f"sdpfa_bwd: logsumexp must have rank {q.rank - 1}, got "
                              f"{t['logsumexp'].rank}")
    return [OutSig(x.dtype, x.broadcast) for x in (q, k, v)]


def _sdpa_bwd_shape(in_shapes, attrs, ev):
    grad, q, k, v = in_shapes[:4]
    out = sdpa_out_shape(q, k, v)
    if tuple(grad) != out:
        raise InputError(f"sdpfa_bwd: grad_output has shape {list(grad)}, the attention output "
                         f"{list(out)}")
    return [q, k, v]


register(OpSpec("sdpfa_bwd", (Param("grad_output", "T"), Param("query", "T"), Param("key", "T"),
                              Param("value", "T"), Param("output", "T"), Param("logsumexp", "T"),
                              Param("dropout_p", "S?", None), Param("is_causal", "S?", None),
                              Param("philox_seed", "T?", None),
                              Param("philox_offset", "T?", None), Param("scale", "S?", None)),
                OpClass.LIBRARY, _sdpa_bwd_infer, _sdpa_bwd_shape, n_outputs=3, cost=0))


# ---- embedding, scatter, index_put_accumulate ---------------------------------------------------


def _int_tensor(v, op: str, what: str) -> TensorValue:
    t = _tensor(v, op, what)
    if not t.dtype.is_int:
        raise DefinitionError(f"{op}: {what} {t.name} must be an integer tensor, got "
                              f"{t.dtype.value}")
    return t


def _embedding_infer(ins, attrs):
    idx, weight = _int_tensor(ins[0], "embedding_fwd", "input"), \
        _tensor(ins[1], "embedding_fwd", "weight")
    if idx.rank < 1 or weight.rank != 2:
        raise DefinitionError(f"embedding_fwd: input must have rank >= 1 and weight rank 2, got "
                              f"{idx.rank} and {weight.rank}")
    return [OutSig(weight.dtype, idx.broadcast + (weight.broadcast[1],))]


register(OpSpec("embedding_fwd", (Param("input", "T"), Param("weight", "T"),
                                  Param("padding_idx", "S?", None), Param("max_norm", "S?", None),
                                  Param("norm_type", "S?", None),
                                  Param("scale_grad_by_freq", "S?", None),
                                  Param("sparse", "S?", None)),
                OpClass.FALLBACK, _embedding_infer,
                lambda s, a, ev: [tuple(s[0]) + (s[1][1],)], cost=0))


def _scatter_infer(ins, attrs):
    arg, index = _tensor(ins[0], "scatter", "arg"), _int_tensor(ins[1], "scatter", "index")
    src = ins[2]
    if index.rank != arg.rank or (isinstance(src, TensorValue) and src.rank != arg.rank):
        raise DefinitionError(f"scatter: arg, index and src must have the same rank, got "
                              f"{arg.rank}, {index.rank}"
                              f"{', ' + str(src.rank) if isinstance(src, TensorValue) else ''}")
    dim = norm_axis(attrs["dim"], arg.rank, zero_d=False)
    return [OutSig(arg.dtype, tuple(False if a == dim else b for a, b in enumerate(arg.broadcast)))]


def _scatter_shape(in_shapes, attrs, ev):
    arg, index, src = in_shapes
    for a, (e, j) in enumerate(zip(arg, index)):
        limit = e if src is None else min(e, src[a])
        if j > limit:
            raise InputError(f"scatter: index axis {a} has extent {j}, more than arg or src "
                             f"({limit})")
    return [tuple(arg)]


register(OpSpec("scatter", (Param("arg", "T"), Param("index", "T"), Param("src", "V"),
                            Param("dim", "I")),
                OpClass.FALLBACK, _scatter_infer, _scatter_shape, cost=0))


def _index_put_infer(ins, attrs):
    acc = _tensor(ins[0], "index_put_accumulate", "acc")
    index = _int_tensor(ins[1], "index_put_accumulate", "index")
    value = _tensor(ins[2], "index_put_accumulate", "value")
    if index.rank != 1 or value.rank != acc.rank:
        raise DefinitionError(f"index_put_accumulate: index must have rank 1 and value acc's rank "
                              f"{acc.rank}, got {index.rank} and {value.rank}")
    return [OutSig(acc.dtype, _dense(acc.rank))]


def _index_put_shape(in_shapes, attrs, ev):
    acc, index, value = in_shapes
    if value[0] != index[0] or tuple(value[1:]) != tuple(acc[1:]):
        raise InputError(f"index_put_accumulate: value has shape {list(value)}; expected "
                         f"{[index[0], *acc[1:]]}")
    return [tuple(acc)]


register(OpSpec("index_put_accumulate", (Param("acc", "T"), Param("index", "T"),
                                         Param("value", "T")),
                OpClass.FALLBACK, _index_put_infer, _index_put_shape, cost=1))


# ---- sorting -----------------------------------------------------------------------------------


def _topk_infer(ins, attrs):
    arg = _tensor(ins[0], "topk", "arg")
    if not ins[1].dtype.is_int:
        raise DefinitionError(f"topk: k {ins[1].name} must be an integer scalar")
    dim = norm_axis(attrs["dim"], arg.rank, zero_d=False)
    flags = tuple(False if a == dim else b for a, b in enumerate(arg.broadcast))
    return [OutSig(arg.dtype, flags), OutSig(DType.int64, flags)]


def _topk_shape(in_shapes, attrs, ev):
    src = in_shapes[0]
    dim = attrs["dim"] % len(src)
    k = check_extent(ev.operand(1), "topk k")
    if not 0 <= k <= src[dim]:
        raise InputError(f"Invalid resized domain extent: topk: k = {k} is out of range for an "
                         f"axis of extent {src[dim]}")
    out = tuple(k if a == dim else e for a, e in enumerate(src))
    return [out, out]


register(OpSpec("topk", (Param("arg", "T"), Param("k", "S"), Param("dim", "I", -1),
                         Param("largest", "B", True), Param("sorted", "B", False)),
                OpClass.FALLBACK, _topk_infer, _topk_shape, n_outputs=2, cost=4))


def _argsort_infer(ins, attrs):
    arg = _tensor(ins[0], "argsort", "arg")
    norm_axis(attrs["dim"], arg.rank)
    return [OutSig(DType.int64, arg.broadcast)]


register(OpSpec("argsort", (Param("arg", "T"), Param("dim", "I", -1),
                            Param("descending", "B", False), Param("stable", "B", False)),
                OpClass.FALLBACK, _argsort_infer, lambda s, a, ev: [tuple(s[0])], cost=4))


# ---- grouped matmul ----------------------------------------------------------------------------
# grouped_mm(mat1, mat2, offsets): offsets [G] are the cumulative ends of the groups (as in
# torch._grouped_mm):
#   [M, K] x [G, K, N] -> [M, N]     groups of mat1's rows, one weight each (MoE);
#   [G, M, K] x [K, N] -> [M, N]     groups of mat2's columns, one mat1 each;
#   [M, K] x [K, N]    -> [G, M, N]  groups along K (weight gradients).


def _grouped_rank(r1: int, r2: int) -> int:
    if (r1, r2) == (2, 2):
        return 3
    if (r1, r2) in ((3, 2), (2, 3)):
        return 2
    raise DefinitionError(f"grouped_mm: operand ranks {r1} and {r2} are not 2x3, 3x2 or 2x2 (two "
                          f"3-D operands are a batched matmul)")


def _grouped_infer(ins, attrs):
    t = _operands(ins, attrs, "grouped_mm")
    m1, m2, offs = t["mat1"], t["mat2"], t["offsets"]
    if offs.rank != 1 or not offs.dtype.is_int:
        raise DefinitionError("grouped_mm: offsets must be a 1-D integer tensor")
    if m1.dtype != m2.dtype or not m1.dtype.is_float:
        raise DefinitionError(f"grouped_mm: mat1 and mat2 must share a floating-point dtype, got "
                              f"{m1.dtype.value} and {m2.dtype.value}")
    return [OutSig(m1.dtype, _dense(_grouped_rank(m1.rank, m2.rank)))]


def grouped_mm_shape(m1: tuple[int, ...], m2: tuple[int, ...], g: int) -> tuple[int, ...]:
    if m1[-1] != m2[-2]:
        raise InputError(f"grouped_mm: mat1 {list(m1)} and mat2 {list(m2)} differ in K")
    if len(m1) == 2 and len(m2) == 3:
        if m2[0] != g:
            raise InputError(f"grouped_mm: mat2 has {m2[0]} groups, offsets {g}")
        return (m1[0], m2[2])
    if len(m1) == 3 and len(m2) == 2:
        if m1[0] != g:
            raise InputError(f"grouped_mm: mat1 has {m1[0]} groups, offsets {g}")
        return (m1[1], m2[1])
    return (g, m1[0], m2[1])


register(OpSpec("grouped_mm", (Param("mat1", "T"), Param("mat2", "T"), Param("offsets", "T")),
                OpClass.LIBRARY, _grouped_infer,
                lambda s, a, ev: [grouped_mm_shape(s[0], s[1], s[2][0])], cost=0))

_CUTLASS = ("mat1", "mat2", "scale1", "scale2", "alpha", "problem_sizes", "expert_offsets",
            "sf_offsets")


def _cutlass_infer(ins, attrs):
    t = _operands(ins, attrs, "cutlass_nvfp4_grouped_mm")
    if t["mat1"].rank != 2 or t["mat2"].rank != 3:
        raise DefinitionError(f"cutlass_nvfp4_grouped_mm: mat1 must have rank 2 and mat2 rank 3, "
                              f"got {t['mat1'].rank} and {t['mat2'].rank}")
    dtype = attrs["dtype"] or DType.bfloat16
    return [OutSig(dtype, _dense(2))]


register(OpSpec("cutlass_nvfp4_grouped_mm", tuple(Param(n, "T") for n in _CUTLASS)
                + (Param("dtype", "DT", DType.bfloat16),),
                OpClass.LIBRARY, _cutlass_infer, lambda s, a, ev: [(s[0][0], s[1][2])], cost=0))


def _preprocess_sf_infer(ins, attrs):
    t = _operands(ins, attrs, "preprocess_grouped_matmul_input_sf")
    if t["input"].rank != 2:
        raise DefinitionError("preprocess_grouped_matmul_input_sf: input must have rank 2")
    return [OutSig(t["input"].dtype, _dense(2))]


register(OpSpec("preprocess_grouped_matmul_input_sf",
                (Param("input", "T"), Param("input_offsets", "T"), Param("output_offsets", "T")),
                OpClass.FALLBACK, _preprocess_sf_infer, lambda s, a, ev: [tuple(s[0])], cost=0))


# ---- block quantization (NVFP4 / MXFP8) --------------------------------------------------------
# quantized: the input's shape in ``dtype``; block scales: the last axis divided by block_size.


def _block_quantize_infer(op: str):
    def infer(ins, attrs):
        t = _operands(ins, attrs, op)
        x = t["input"]
        dtype = attrs["dtype"] or DType.float4_e2m1fn
        if dtype not in BLOCK_QUANTIZE:
            raise DefinitionError(f"{op}: dtype must be Float4_e2m1fn or Float8_e4m3fn, got "
                                  f"{dtype.value}")
        scale_dtype, block = BLOCK_QUANTIZE[dtype]
        if attrs["block_size"] != block:
            raise DefinitionError(f"{op}: block_size must be {block} for {dtype.value}, got "
                                  f"{attrs['block_size']}")
        if x.dtype not in (DType.float32, DType.bfloat16, DType.float16) or x.rank < 1:
            raise DefinitionError(f"{op}: input must be a float32/bfloat16/float16 tensor of rank "
                                  f">= 1, got {x.dtype.value} of rank {x.rank}")
        if op == "nv_grouped_block_quantize" and x.rank != 2:
            raise DefinitionError(f"{op}: input must have rank 2, got {x.rank}")
        if "global_scale" in t and (t["global_scale"].rank or
                                    t["global_scale"].dtype is not DType.float32):
            raise DefinitionError(f"{op}: global_scale must be a 0-dim float32 tensor")
        return [OutSig(dtype, _dense(x.rank)), OutSig(scale_dtype, _dense(x.rank))]

    return infer


def _block_quantize_shape(in_shapes, attrs, ev):
    x = tuple(in_shapes[0])
    if x[-1] % attrs["block_size"]:
        raise InputError(f"block quantize: the last extent {x[-1]} is not a multiple of the block "
                         f"size {attrs['block_size']}")
    return [x, x[:-1] + (x[-1] // attrs["block_size"],)]


register(OpSpec("nv_block_quantize", (Param("input", "T"), Param("global_scale", "T?", None),
                                      Param("swizzle_block_scales", "B", False),
                                      Param("block_size", "I", 16),
                                      Param("dtype", "DT", DType.float4_e2m1fn)),
                OpClass.FALLBACK, _block_quantize_infer("nv_block_quantize"),
                _block_quantize_shape, n_outputs=2, cost=4))
register(OpSpec("nv_grouped_block_quantize",
                (Param("input", "T"), Param("input_offsets", "T"), Param("output_offsets", "T"),
                 Param("global_scale", "T?", None), Param("block_size", "I", 16),
                 Param("dtype", "DT", DType.float4_e2m1fn)),
                OpClass.FALLBACK,
                _block_quantize_infer("nv_grouped_block_quantize"),
                _block_quantize_shape, n_outputs=2, cost=4))
