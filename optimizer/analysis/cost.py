"""The I/O cost model.

A segment reads each of its inputs once and writes each of its outputs once, all in compact form
(broadcast and stride-0 axes are not stored). Its estimated time is the larger of its memory time
(bytes over copy bandwidth) and its arithmetic time, plus a launch overhead per kernel. The lower
bound of a fusion reads every used input once and writes every output once.
"""

from __future__ import annotations

from optimizer.analysis.opclass import op_cost
from optimizer.analysis.shapes import Bound
from optimizer.schedulers.kinds import Kind, Schedule
from optimizer.schedulers.online import RESCALE_COST
from optimizer.schedulers.profiles import DeviceProfile

KERNELS_PER_SEGMENT = {Kind.INNER_OUTER: 2}  # the row kernel and the column finisher


def read_bytes(bound: Bound, schedule: Schedule) -> int:
    return sum(bound.nbytes(t) for t in schedule.inputs)


def write_bytes(bound: Bound, schedule: Schedule) -> int:
    return sum(bound.nbytes(t) for t in schedule.outputs)


def compute_units(bound: Bound, schedule: Schedule) -> float:
    units = sum(op_cost(bound.fusion.ops[i], bound) for i in schedule.ops)
    # an online log-sum-exp rescales its running sum as the maximum grows
    units += sum(RESCALE_COST * bound.numel(bound.fusion.ops[m].inputs[0])
                 for m, _ in schedule.online)
    return units


def segment_time(bound: Bound, schedule: Schedule, profile: DeviceProfile) -> float:
    io = read_bytes(bound, schedule) + write_bytes(bound, schedule)
    if schedule.kind is Kind.LIBRARY:
        compute = compute_units(bound, schedule) / (profile.compute_rate * 15)  # tensor cores
    else:
        compute = compute_units(bound, schedule) / profile.compute_rate
    kernels = KERNELS_PER_SEGMENT.get(schedule.kind, 1)
    return max(io / profile.bandwidth, compute) + kernels * profile.launch_overhead_s


def lower_bound_bytes(bound: Bound) -> int:
    fusion = bound.fusion
    used = {n for i in fusion.live_tensor_ops() for n in fusion.ops[i].inputs
            if n in fusion.tensors}
    reads = sum(bound.nbytes(t) for t in fusion.tensor_inputs() if t in used)
    writes = sum(bound.nbytes(t) for t in dict.fromkeys(fusion.outputs)
                 if t not in fusion.inputs)
    return reads + writes
