"""Pointwise segments: one grid-stride loop over the reference output's domain.

Each thread takes VEC consecutive elements of the innermost axis per step (16-byte vectors where
the innermost extent allows): inputs that follow the innermost axis with unit stride are loaded as
one vector, inputs broadcast along it are loaded once per vector, others per element; the
reference output (and any output laid out like it) is stored as one vector. Other outputs are
written where their index is in range, once per element.
"""

from __future__ import annotations

from codegen import cuda
from codegen.emit import Emitter
from codegen.kernel import Kernel, SegmentKernels, assemble, indent, signature, tensor_params
from codegen.layout import address, compact_strides, decompose, index_type, numel, tensor_strides
from optimizer.analysis.shapes import Bound
from optimizer.schedulers.kinds import Schedule
from optimizer.schedulers.profiles import DeviceProfile

THREADS = 256
LANE = "_lane"


def vector_width(bound: Bound, schedule: Schedule, innermost: int) -> int:
    tensors = list(schedule.inputs) + list(schedule.outputs)
    smallest = min(bound.fusion.tensors[t].dtype.itemsize for t in tensors)
    v = max(1, min(8, 16 // smallest))
    while v > 1 and innermost % v:
        v //= 2
    return v


def generate_pointwise(bound: Bound, schedule: Schedule, profile: DeviceProfile, index: int,
                       vector: int | None = None) -> SegmentKernels:
    fusion = bound.fusion
    domain = list(schedule.domain)
    rank = len(domain)
    total = numel(domain)
    name = f"fusecut_segment{index}_pointwise"
    if total == 0:
        return SegmentKernels(index, "pointwise", "", [])
    vec = vector or vector_width(bound, schedule, domain[-1] if domain else 1)
    itype = index_type(bound, list(schedule.inputs) + list(schedule.outputs), total)
    xs = [f"x{a}" for a in range(rank)]
    lane_expr = f"({xs[-1]} + {LANE})" if rank and vec > 1 else (xs[-1] if rank else "0")
    domain_idx = tuple(xs[:-1] + [lane_expr]) if rank else ()
    pre: list[str] = []
    aligned: dict[str, int] = {}
    vec_loads: dict[tuple, str] = {}

    def load(t: str, idx: tuple[str, ...]) -> str:
        d = fusion.tensors[t].dtype
        strides = tensor_strides(bound, t)
        st, ct = cuda.storage(d), cuda.compute(d)
        invariant = all(LANE not in i for i in idx)
        if invariant:
            name_ = em.fresh("l")
            value = cuda.to_compute(f"in_{t}[{address(idx, strides)}]", d)
            pre.append(f"const {ct} {name_} = {value};")
            return name_
        lanes = [a for a, i in enumerate(idx) if LANE in i]
        if (vec > 1 and len(lanes) == 1 and idx[lanes[0]] == lane_expr
                and strides[lanes[0]] == 1
                and all(s % vec == 0 for a, s in enumerate(strides) if a != lanes[0])):
            base = tuple(xs[-1] if a == lanes[0] else i for a, i in enumerate(idx))
            key = (t, base)
            if key not in vec_loads:
                vname = em.fresh("vl")
                pre.append(f"const fc_vec<{st}, {vec}> {vname} = *reinterpret_cast<const "
                           f"fc_vec<{st}, {vec}>*>(in_{t} + {address(base, strides)});")
                vec_loads[key] = vname
                aligned[t] = vec * d.itemsize
            return cuda.to_compute(f"{vec_loads[key]}.v[{LANE}]", d)
        return em.let(ct, cuda.to_compute(f"in_{t}[{address(idx, strides)}]", d), "l")

    em = Emitter(bound, schedule.ops, set(schedule.inputs), load, itype)
    stores_after: list[str] = []
    vec_outputs: list[str] = []
    for t in schedule.outputs:
        d = fusion.tensors[t].dtype
        amap = schedule.axis_map[t]
        shape = bound.shapes[t]
        identity = (amap == tuple(range(rank)) and tuple(shape) == tuple(domain)
                    and not any(bound.broadcast[t]))
        out_idx = tuple("0" if m is None else domain_idx[m] for m in amap)
        val = em.value(t, out_idx)
        if identity and vec > 1:
            em.lines.append(f"o_{t}.v[{LANE}] = {cuda.to_storage(val, d)};")
            vec_outputs.append(t)
            stores_after.append(f"*reinterpret_cast<fc_vec<{cuda.storage(d)}, {vec}>*>(out_{t} + "
                                f"{address(tuple(xs), compact_strides(bound, t))}) = o_{t};")
            aligned[t] = vec * d.itemsize
            continue
        guards = []
        covered = {m for m in amap if m is not None}
        for dax in range(rank):
            if dax not in covered:
                guards.append(f"{domain_idx[dax]} == 0")
        for a, m in enumerate(amap):
            if m is not None and shape[a] < domain[m]:
                guards.append(f"{domain_idx[m]} < {shape[a]}")
        store = (f"out_{t}[{address(out_idx, compact_strides(bound, t))}] = "
                 f"{cuda.to_storage(val, d)};")
        em.lines.append(f"if ({' && '.join(guards)}) {store}" if guards else store)
    params = tensor_params(bound, schedule.inputs, schedule.outputs, em.params)
    n_vec = total // vec
    blocks = max(1, min(-(-n_vec // THREADS), profile.sm_count * 8))
    body = [f"// segment {index}: pointwise over {domain} ({total} elements), "
            f"{vec} per thread per step",
            f"typedef {itype} index_t;",
            signature(name, params, THREADS) + " {",
            f"  const index_t n_vec = {n_vec};",
            "  for (index_t v = (index_t)blockIdx.x * blockDim.x + threadIdx.x; v < n_vec;"
            " v += (index_t)gridDim.x * blockDim.x) {"]
    inner = [f"const index_t flat = v * {vec};"] if rank else []
    inner += decompose("flat", domain, xs, "index_t")
    inner.append("// loads that are the same for every lane of the vector")
    inner += pre
    for t in vec_outputs:
        inner.append(f"fc_vec<{cuda.storage(fusion.tensors[t].dtype)}, {vec}> o_{t};")
    if vec > 1:
        inner += ["#pragma unroll", f"for (int {LANE} = 0; {LANE} < {vec}; ++{LANE}) {{"]
        inner += ["  // per element"] + indent(em.lines, 2) + ["}"]
    else:
        inner += ["// per element"] + em.lines
    if stores_after:
        inner += ["// vector stores"] + stores_after
    body += indent(inner, 4) + ["  }", "}"]
    kernel = Kernel(name, params, (blocks, 1, 1), (THREADS, 1, 1))
    return SegmentKernels(index, "pointwise", assemble(body), [kernel], [], aligned,
                          {"vector": vec, "index_type": itype})
