"""Per-call seed and offsets of unseeded random ops, from torch's default generator.

A plan of a fusion with unseeded ``uniform``/``normal`` takes extra trailing scalar inputs
(``optimizer.ir.rng``): a seed and one Philox counter offset per such op. Every call appends
fresh values to the caller's arguments, as nvFuser's ``GetRNGSeedAndOffsetFromHost`` does:

- CUDA: the seed of the device's default generator and its Philox offset ``o`` (in 32-bit
  words, torch's unit); op ``j`` takes counter offset ``o // 4 + j`` and the generator's offset
  advances by ``4 * ops``, the increment ``philox_cuda_state(4 * ops)`` makes. ``manual_seed``
  then reproduces a run, consecutive calls differ, and torch's own random kernels (which take
  their offsets from the same generator) never reuse these counters.
- CPU: the default CPU generator (a Mersenne twister, no offset) gives one 64-bit seed per call;
  op ``j`` takes offset ``j``. ``manual_seed`` reproduces, and consecutive calls differ.

One lock serialises draws from this module (torch's own kernels take the generator's C++ mutex,
which Python cannot; a call reads and advances the offset in two steps).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

_lock = threading.Lock()
_INT64 = 1 << 64


def _signed(value: int) -> int:
    """A 64-bit word as the int64 a scalar argument holds (kernels take it back unsigned)."""
    value &= _INT64 - 1
    return value - _INT64 if value >= 1 << 63 else value


def rng_device(args: Sequence[Any]) -> torch.device | None:
    """The CUDA device of the first CUDA tensor argument, else None (the CPU generator)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return a.device
    return None


def _generator(device: torch.device) -> torch.Generator:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


def draw(ops: int, device: torch.device | None) -> tuple[list[int], int | None]:
    """([seed, offset of op 0, ..., offset of op ops-1], the CUDA generator's offset before)
    for one call, advancing the generator."""
    if device is None:
        seed = int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64))
        return [seed, *range(ops)], None
    gen = _generator(device)
    with _lock:
        before = gen.get_offset()
        gen.set_offset(before + 4 * ops)
    seed = _signed(gen.initial_seed())
    return [seed, *(_signed(before // 4 + j) for j in range(ops))], before


def undo(ops: int, device: torch.device | None, before: int | None) -> None:
    """Give back a CUDA draw no kernel used (a warm call whose arguments did not match), when
    nothing drew after it; a CPU draw cannot be given back."""
    if device is None or before is None:
        return
    gen = _generator(device)
    with _lock:
        if gen.get_offset() == before + 4 * ops:
            gen.set_offset(before)


def with_implicit_rng(implicit: Sequence[str], n_inputs: int, args: list[Any]) -> list[Any]:
    """``args`` with this call's draws appended when the caller gave only its own arguments
    (``n_inputs`` counts the implicit ones too); unchanged otherwise."""
    if not implicit or len(args) != n_inputs - len(implicit):
        return args
    return [*args, *draw(len(implicit) - 1, rng_device(args))[0]]


def call_with_draw(ops: int, device: torch.device | None, args: list[Any],
                   run: Callable[[list[Any]], Any]) -> Any:
    """``run(args + this call's draw)``; the draw is given back when ``run`` answers None (the
    arguments did not match: another program runs them, and draws)."""
    values, before = draw(ops, device)
    result = run([*args, *values])
    if result is None:
        undo(ops, device, before)
    return result
