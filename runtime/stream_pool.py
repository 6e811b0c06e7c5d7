"""The CUDA streams and events stream loops run on, per device, and each segment's operands:
shared by the Python loop (``runtime.streams``) and its C++ description
(``runtime.native_host``)."""

from __future__ import annotations

import threading

import torch

from fusecut.optimizer.plan.plan import Plan

_pools: dict[int, list[tuple[torch.cuda.Stream, torch.cuda.Event]]] = {}
_entries: dict[int, torch.cuda.Event] = {}
_pool_lock = threading.Lock()


def stream_pool(device: torch.device, count: int) -> list[torch.cuda.Stream]:
    """``count`` streams of ``device``, created once and reused by every loop."""
    return [stream for stream, _ in events_pool(device, count)]


def events_pool(device: torch.device, count: int
                ) -> list[tuple[torch.cuda.Stream, torch.cuda.Event]]:
    """The pool's streams, each with an event that marks its latest iteration's end (recorded
    once when made, so that its driver handle exists for the C++ loop)."""
    with _pool_lock:
        pool = _pools.setdefault(device.index, [])
        while len(pool) < count:
            stream, done = torch.cuda.Stream(device), torch.cuda.Event()
            done.record(stream)
            pool.append((stream, done))
        return pool[:count]


def entry_event(device: torch.device) -> torch.cuda.Event:
    """The device's event that C++ loops record on the caller's stream before their first
    iteration (the GIL orders its uses: the launcher holds it throughout a call)."""
    with _pool_lock:
        event = _entries.get(device.index)
        if event is None:
            event = _entries[device.index] = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
        return event


def segment_io(plan: Plan, j: int) -> tuple[list[tuple[str, bool]], list[str]]:
    """Segment ``j``'s arguments (original names, whether a tensor) and results, once."""
    cache = plan.runtime_memo.setdefault("segment_io", {})
    io = cache.get(j)
    if io is None:
        sub = plan.segments[j].sub
        io = cache[j] = ([(sub.input_map[n], sub.input_map[n] in plan.fusion.tensors)
                          for n in sub.fusion.inputs],
                         [sub.output_map[n] for n in sub.fusion.outputs])
    return io
