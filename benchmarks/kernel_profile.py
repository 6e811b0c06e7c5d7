"""GPU time of one call, from the profiler: the sum of the device activity (kernels, and the
memsets and memcpys the call itself launched) that each marked call caused, and how many kernels it
launched.

All calls are profiled in one session, each inside a ``record_function`` marker that ends after a
device synchronisation, so every kernel of call i runs inside marker i's range. A device event
is placed by the CPU time of the API call that launched it (cudaLaunchKernel, cuLaunchKernel...,
matched through the CUPTI correlation id), and only falls back on its own device timestamp when no
launch was recorded: some CUPTI builds hand back device timestamps from another clock after a
session restarts, and the launch's CPU time is immune to that.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MARKER = "fusecut-bench:"
WARMUP = "_warmup"
LAUNCH_API = re.compile(r"^cu(da)?[A-Z]")  # runtime (cudaLaunchKernel) and driver (cuLaunchKernel)
SYNC_ACTIVITY = re.compile(r"(^|\s)(sync|synchronize)$", re.IGNORECASE)  # "Stream Sync", ...


@dataclass(frozen=True)
class TraceEvent:
    """One profiler event, reduced to what the split needs (times in microseconds)."""

    name: str
    on_device: bool
    correlation: int
    start_us: float
    end_us: float
    annotation: bool = False  # a record_function range mirrored on the device timeline


@dataclass
class CallKernels:
    """Device activity of one call."""

    device_s: float = 0.0
    kernels: int = 0
    memsets: int = 0
    memcpys: int = 0
    failed: str = ""


@dataclass
class KernelStats:
    """Medians over the profiled calls of one system on one case."""

    device_s: float
    kernels: int
    memsets: int
    memcpys: int
    calls: int
    notes: list[str] = field(default_factory=list)


def device_kind(name: str) -> str:
    """'memcpy', 'memset', 'sync' (waits, not work) or 'kernel', from a device event's name."""
    low = name.lower()
    if low.startswith("memcpy"):
        return "memcpy"
    if low.startswith("memset"):
        return "memset"
    if SYNC_ACTIVITY.search(name):
        return "sync"
    return "kernel"


def trace_events(function_events: Iterable) -> list[TraceEvent]:
    """torch.profiler FunctionEvents as TraceEvents."""
    from torch.autograd import DeviceType

    out = []
    for e in function_events:
        out.append(TraceEvent(
            name=e.name, on_device=e.device_type == DeviceType.CUDA,
            correlation=int(getattr(e, "id", -1)), start_us=float(e.time_range.start),
            end_us=float(e.time_range.end),
            annotation=bool(getattr(e, "is_user_annotation", False))))
    return out


def split_by_call(events: list[TraceEvent], prefix: str = MARKER
                  ) -> tuple[dict[str, CallKernels], int]:
    """Device activity per marker range (markers are CPU events named ``prefix...``), and the
    number of device events that fell in no range."""
    ranges = sorted((e.start_us, e.end_us, e.name) for e in events
                    if not e.on_device and e.name.startswith(prefix))
    starts = [r[0] for r in ranges]
    launched_at = {e.correlation: e.start_us for e in events
                   if not e.on_device and LAUNCH_API.match(e.name)}
    calls = {name: CallKernels() for _, _, name in ranges}
    unassigned = 0
    for e in events:
        if not e.on_device or e.annotation or e.name.startswith(prefix):
            continue
        kind = device_kind(e.name)
        if kind == "sync":
            continue
        t = launched_at.get(e.correlation, e.start_us)
        k = bisect.bisect_right(starts, t) - 1
        if k < 0 or t > ranges[k][1]:
            unassigned += 1
            continue
        call = calls[ranges[k][2]]
        call.device_s += (e.end_us - e.start_us) * 1e-6
        if kind == "kernel":
            call.kernels += 1
        elif kind == "memset":
            call.memsets += 1
        else:
            call.memcpys += 1
    return calls, unassigned


def marker(key: str, i: int) -> str:
    return f"{MARKER}{key}#{i}"


def summarize_calls(calls: dict[str, CallKernels], unassigned: int = 0
                    ) -> dict[str, KernelStats]:
    """Per key (the marker without its call number): medians over the calls that ran."""
    grouped: dict[str, list[CallKernels]] = {}
    for name, call in calls.items():
        key = name[len(MARKER):].rsplit("#", 1)[0]
        grouped.setdefault(key, []).append(call)
    out = {}
    for key, group in grouped.items():
        ran = [c for c in group if not c.failed]
        notes = sorted({c.failed for c in group if c.failed})
        if not ran:
            out[key] = KernelStats(float("nan"), 0, 0, 0, 0, notes)
            continue
        stats = KernelStats(
            device_s=statistics.median(c.device_s for c in ran),
            kernels=statistics.median_low(c.kernels for c in ran),
            memsets=statistics.median_low(c.memsets for c in ran),
            memcpys=statistics.median_low(c.memcpys for c in ran), calls=len(ran), notes=notes)
        if stats.kernels == 0 and stats.memsets == 0 and stats.memcpys == 0:
            stats.notes.append("the profiler saw no device activity")
            stats.device_s = float("nan")
        out[key] = stats
    if unassigned:
        for stats in out.values():
            stats.notes.append(f"{unassigned} device events of the session fell in no call")
    return out


def profile_calls(jobs: list[tuple[str, Callable[[], object]]], calls: int = 5,
                  log: Callable[[str], None] = print, device: str = "cuda"
                  ) -> dict[str, KernelStats]:
    """Profile ``calls`` runs of every job (key, function) in one profiler session. A job that
    raises is recorded as failed and the session goes on."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    failures: dict[str, str] = {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # The first activity of a session can be lost while CUPTI starts: spend it on scratch.
        with record_function(marker(WARMUP, 0)):
            torch.ones(1 << 20, device=device).mul_(2)
            torch.cuda.synchronize()
        for key, fn in jobs:
            for i in range(calls):
                torch.cuda.synchronize()
                with record_function(marker(key, i)):
                    try:
                        fn()
                        torch.cuda.synchronize()
                    except Exception as exc:  # one failing system never aborts the session
                        failures[marker(key, i)] = f"profiled call failed: {type(exc).__name__}"
            log(f"  profiled {key}")
    calls_seen, unassigned = split_by_call(trace_events(prof.events()))
    for name, why in failures.items():
        calls_seen.setdefault(name, CallKernels()).failed = why
    stats = summarize_calls(calls_seen, unassigned)
    stats.pop(WARMUP, None)
    return stats
