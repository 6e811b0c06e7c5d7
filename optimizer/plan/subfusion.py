"""Translate one segment back into a standalone fusion definition.

The segment's inputs become ``define_tensor``s: fusion inputs keep their declaration; a boundary
tensor arrives in compact form (its broadcast axes were never stored) and is broadcast
back with ``broadcast_in_dim`` under its original name, so the segment's ops replay unchanged.
Written tensors with broadcast axes are squeezed to their compact form before ``add_output``.
Scalars the ops use become constants, ``T.size(i)`` of an input, or scalar inputs. ``input_map``
and ``output_map`` tie the segment's values to the original fusion's.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.builder import FusionBuilder, ScalarHandle, TensorHandle
from fusecut.optimizer.ir.descriptor import allocation_contiguity
from fusecut.optimizer.ir.fusion import Fusion, Ref
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta, contiguous_strides
from fusecut.optimizer.kinds.rules import Schedule


@dataclass
class SubFusion:
    fusion: Fusion
    input_map: dict[str, str]  # segment input (tensor or scalar) -> original value
    output_map: dict[str, str]  # segment output -> original tensor
    inputs: list[InputMeta]  # concrete metadata of the segment's inputs, in order


def compact_axes(bound: Bound, tensor: str) -> list[int]:
    """The axes of a boundary tensor that are stored (not broadcast)."""
    return [a for a, b in enumerate(bound.broadcast[tensor]) if not b]


def translate(bound: Bound, schedule: Schedule) -> SubFusion:
    fusion = bound.fusion
    b = FusionBuilder()
    names: dict[str, str] = {}
    input_map: dict[str, str] = {}
    metas: list[InputMeta] = []

    def handle(name: str):
        sub = names[name]
        return TensorHandle(b, sub) if sub in b.fusion.tensors else ScalarHandle(b, sub)

    for t in schedule.inputs:
        tv = fusion.tensors[t]
        if t in bound.inputs:
            h = b.define_tensor(list(tv.declared_shape),
                                allocation_contiguity(tv.contiguity, tv.stride_order), tv.dtype,
                                stride_order=list(tv.stride_order) if tv.stride_order else None,
                                name=t)
            input_map[h.name] = t
            metas.append(bound.inputs[t])
            names[t] = h.name
            continue
        axes = compact_axes(bound, t)
        shape = bound.shapes[t]
        compact = tuple(shape[a] for a in axes)
        if len(axes) == len(shape):
            h = b.define_tensor([-1] * len(shape), [True] * len(shape), tv.dtype, name=t)
            names[t] = h.name
        else:
            h = b.define_tensor([-1] * len(axes), [True] * len(axes), tv.dtype, name=f"{t}_c")
            sizes = {a: h.size(k) for k, a in enumerate(axes)}
            target = [sizes.get(a, shape[a]) for a in range(len(shape))]
            (full,) = b.op("broadcast_in_dim", [h], {"shape": target, "broadcast_dims": axes},
                           [t])
            names[t] = full.name
        input_map[h.name] = t
        metas.append(TensorMeta(compact, contiguous_strides(compact), tv.dtype))
    for op_index in schedule.ops:
        for ref in fusion.ops[op_index].refs():
            if ref in fusion.scalars:
                _scalar(bound, b, ref, names, input_map, metas)
    for op_index in schedule.ops:
        op = fusion.ops[op_index]
        attrs = {k: _map_refs(v, names) for k, v in op.attrs.items()}
        outs = b.add_op(op.name, [names[n] for n in op.inputs], attrs, list(op.outputs))
        for o, h in zip(op.outputs, outs):
            names[o] = h.name
    output_map: dict[str, str] = {}
    for t in schedule.outputs:
        axes = compact_axes(bound, t)
        h = handle(t)
        if len(axes) < len(bound.shapes[t]):
            dropped = [a for a in range(len(bound.shapes[t])) if a not in axes]
            (h,) = b.op("squeeze", [h], {"dims": dropped, "squeeze_expanded": True},
                        [f"{t}_c"])
        b.add_output(h)
        output_map[h.name] = t
    return SubFusion(b.fusion, input_map, output_map, metas)


def _map_refs(value, names: dict[str, str]):
    if isinstance(value, Ref):
        return Ref(names[value.name])
    if isinstance(value, list):
        return [_map_refs(v, names) for v in value]
    return value


def _scalar(bound: Bound, b: FusionBuilder, name: str, names: dict[str, str],
            input_map: dict[str, str], metas: list[InputMeta]) -> None:
    """Define a scalar the segment's ops use: a constant, a size of an available tensor, a
    scalar op over resolvable scalars (its operands first, depth first; a stack, not
    recursion: scalar chains can be long), or else a scalar input carrying the host value."""
    fusion = bound.fusion
    stack = [name]
    while stack:
        s = stack[-1]
        if s in names:
            stack.pop()
            continue
        sv = fusion.scalars[s]
        p = bound.producers.get(s)
        producer = fusion.ops[p] if p is not None else None
        if sv.value is not None:
            names[s] = b.define_scalar(sv.value, sv.dtype, name=s).name
        elif producer is not None and producer.name == "size" and producer.inputs[0] in names:
            tensor = TensorHandle(b, names[producer.inputs[0]])
            names[s] = b.size(tensor, producer.attrs["dim"], name=s).name
        elif producer is not None and producer.name != "size" and all(
                n in fusion.scalars for n in producer.inputs):
            missing = [n for n in producer.inputs if n not in names]
            if missing:
                stack.extend(reversed(missing))
                continue
            (h,) = b.add_op(producer.name, [names[n] for n in producer.inputs],
                            dict(producer.attrs), [s])
            names[s] = h.name
        else:
            h = b.define_scalar(None, sv.dtype, name=s)
            names[s] = h.name
            input_map[h.name] = s
            metas.append(ScalarMeta(sv.dtype, bound.scalars.get(s)))
        stack.pop()
