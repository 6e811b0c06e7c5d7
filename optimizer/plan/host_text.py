"""Print a host program in the style of nvFuser's ``NVFUSER_DUMP=host_ir``.

    %HostIrContainer { (T0_g_float[iS0{8}, iS1{4096}]) -> (T1_g_float[iStreamIdx2{8}, ...]) :
      T1_g_float[...] = ALLOCATE(buffer=T1_g_float[...], mem_type=global, size=( 8 * 4096 ), ...)
      FOR StreamIdx in iStreamIdx2{8}:
        GetCurrentStream into Stream 0
        ...
    } // %HostIrContainer

Extents are concrete (a plan is made for sizes). A segment's launch names its kind and ops; the
slices it reads and writes are the ``HirAliasSelect``s before it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Fusion

_DTYPE = {DType.float32: "float", DType.float16: "__half", DType.bfloat16: "__bfloat",
          DType.float64: "double", DType.int64: "int64_t", DType.int32: "int", DType.bool: "bool"}
MAX_OPS_SHOWN = 4


class _Namer:
    """Tensor and IterDomain names: the fusion's own tensors keep their names, slices get new
    ``T`` numbers after the fusion's, and every IterDomain one ``{extent}`` id in order."""

    def __init__(self, bound: Bound):
        self.bound = bound
        numbers = [int(m.group(1)) for t in bound.fusion.tensors
                   if (m := re.fullmatch(r"T(\d+)", t))]
        self.next_tensor = max(numbers, default=-1) + 1
        self.next_id = 0
        self.ids: dict[tuple[str, int], str] = {}

    def domain(self, key: tuple[str, int], extent: int, kind: str) -> str:
        name = self.ids.get(key)
        if name is None:
            name = self.ids[key] = f"{kind}{self.next_id}{{{extent}}}"
            self.next_id += 1
        return name

    def tensor(self, name: str, memory: str, shape, broadcast, stream_axis: int | None,
               dtype: DType) -> str:
        axes = []
        for a, (e, b) in enumerate(zip(shape, broadcast)):
            kind = "iStreamIdx" if a == stream_axis else "bS" if b else "iS"
            axes.append(self.domain((name, a), e, kind))
        return f"{name}_{memory}_{_DTYPE.get(dtype, dtype.value)}[{', '.join(axes)}]"

    def whole(self, tensor: str, stream_axis: int | None = None) -> str:
        bound = self.bound
        return self.tensor(tensor, "g", bound.shapes[tensor], bound.broadcast[tensor],
                           stream_axis, self.bound.fusion.tensors[tensor].dtype)

    def local(self, tensor: str, drop_axis: int | None) -> str:
        """A new tensor for one slice of ``tensor`` (its stream axis dropped, as a select does)."""
        bound = self.bound
        keep = [a for a in range(len(bound.shapes[tensor])) if a != drop_axis]
        name = f"T{self.next_tensor}"
        self.next_tensor += 1
        return self.tensor(name, "l", [bound.shapes[tensor][a] for a in keep],
                           [bound.broadcast[tensor][a] for a in keep], None,
                           self.bound.fusion.tensors[tensor].dtype)


def print_host_program(bound: Bound, segments: Sequence, steps: Sequence) -> str:
    """The host program that runs ``segments`` (a plan's) in ``steps`` (its host program's)."""
    fusion = bound.fusion
    namer = _Namer(bound)
    stream_axis = {o: step.stage.axes[o] for step in steps if step.is_loop
                   for i in step.stage.ops for o in fusion.ops[i].outputs
                   if step.stage.axes.get(o) is not None}  # the axes loops write
    ins = ", ".join(namer.whole(t) for t in fusion.tensor_inputs())
    outs = ", ".join(namer.whole(t, stream_axis.get(t)) for t in fusion.outputs)
    lines = [f"%HostIrContainer {{ ({ins}) -> ({outs}) :"]
    streams = 0
    for step in steps:
        if not step.is_loop:
            for j in step.segments:
                seg = segments[j]
                written = [namer.whole(t, stream_axis.get(t)) for t in seg.schedule.outputs]
                read = [namer.whole(t, stream_axis.get(t)) for t in seg.schedule.inputs]
                lines += _launch("  ", fusion, seg, written, read)
            continue
        caller = f"Stream {streams}"
        streams += 1
        for t in step.allocations:
            whole = namer.whole(t, stream_axis.get(t))
            size = " * ".join(str(e) for e in bound.compact_shape(t)) or "1"
            lines.append(f"  {whole} = ALLOCATE(buffer={whole}, mem_type=global, "
                         f"size=( {size} ), zero_init=false, resets_to_zero=false)")
        first = step.allocations[0] if step.allocations else \
            segments[step.segments[0]].schedule.outputs[0]
        axis = step.stage.axes[first]
        loop_id = namer.domain((first, axis), step.stage.extent, "iStreamIdx")
        lines += [f"  FOR StreamIdx in {loop_id}:",
                  f"    GetCurrentStream into {caller}",
                  "    SetCurrentStream to Stream ( StreamIdx % numberOfStreams )",
                  f"    Synchronize {caller}"]
        local: dict[str, str] = {}
        for t, stored in step.slices.items():
            if stored is None:
                continue
            a = step.stage.axes[t]
            whole = namer.whole(t, stream_axis.get(t))
            local[t] = namer.local(t, a)
            lines += [f"    {local[t]}",
                      f"       = HirAliasSelect( {whole}, axis = "
                      f"{namer.domain((t, a), bound.shapes[t][a], 'iS')}, "
                      f"index = StreamIdx )"]
        for j in step.segments:
            seg = segments[j]
            for t in seg.schedule.outputs:
                if t not in local:  # a slice that lives within the iteration
                    local[t] = namer.local(t, step.stage.axes.get(t))
            read = [local.get(t) or namer.whole(t, stream_axis.get(t))
                    for t in seg.schedule.inputs]
            lines += _launch("    ", fusion, seg, [local[t] for t in seg.schedule.outputs], read)
        lines += [f"    SetCurrentStream to {caller}",
                  "    Synchronize Stream ( StreamIdx % numberOfStreams )"]
    lines.append("} // %HostIrContainer")
    return "\n".join(lines) + "\n"


def _launch(indent: str, fusion: Fusion, seg, written: list[str], read: list[str]) -> list[str]:
    ops = [fusion.ops[i] for i in seg.schedule.ops]
    shown = "; ".join(f"{', '.join(op.outputs)} = {op.name}({', '.join(op.inputs)})"
                      for op in ops[:MAX_OPS_SHOWN])
    if len(ops) > MAX_OPS_SHOWN:
        shown += f"; ... {len(ops) - MAX_OPS_SHOWN} more ops"
    target = written[0] if len(written) == 1 else f"({', '.join(written)})"
    return [f"{indent}{target}",
            f"{indent}   = LaunchKernel( segment {seg.index}, {seg.kind.value}, {shown}, "
            f"inputs = ( {', '.join(read)} ) )"]
