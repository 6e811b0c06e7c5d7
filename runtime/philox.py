"""Philox4x32-10 and the uniform/normal values of ``codegen.rng``'s scheme, with torch integer ops.

The reference interpreter draws random numbers here, so CPU and GPU give the same values as the
generated kernels (exactly for uniform; normal to the last bit or two of log/sin/cos). Words are
uint32 values held in int64 tensors; a 32x32-bit product is formed from 16-bit halves so that no
intermediate leaves int64's range.
"""

from __future__ import annotations

import torch

from fusecut.codegen.rng import (
    PHILOX_M0,
    PHILOX_M1,
    PHILOX_ROUNDS,
    PHILOX_W0,
    PHILOX_W1,
    TWO_PI,
    values_per_block,
)

_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of m * x for 32-bit m and x."""
    ph = (x >> 16) * m  # < 2**48
    pl = (x & 0xFFFF) * m  # < 2**48
    hi = (ph + (pl >> 16)) >> 16
    lo = (((ph & 0xFFFF) << 16) + pl) & _MASK32
    return hi, lo


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[int, int],
               rounds: int = PHILOX_ROUNDS) -> list[torch.Tensor]:
    """Philox4x32 of counters (four int64 tensors of 32-bit words) under a 32-bit key pair."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return [c0, c1, c2, c3]


def philox_blocks(seed: int, offset: int, n_blocks: int, device) -> torch.Tensor:
    """Words of blocks 0..n_blocks-1 for (seed, offset), as an [n_blocks, 4] int64 tensor."""
    seed, offset = int(seed) & _MASK64, int(offset) & _MASK64
    block = torch.arange(n_blocks, dtype=torch.int64, device=device)

    def const(v: int) -> torch.Tensor:
        return torch.full_like(block, v)

    counter = (const(offset & _MASK32), const(offset >> 32), block & _MASK32, block >> 32)
    return torch.stack(philox4x32(counter, (seed & _MASK32, seed >> 32)), dim=1)


def _u53(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a << 21) | (b >> 11)


def random_values(kind: str, n: int, wide: bool, seed: int, offset: int, a: float, b: float,
                  device) -> torch.Tensor:
    """Elements 0..n-1 of ``uniform(a, b)`` or ``normal(a, b)``: float64 when ``wide``, else
    float32 (16-bit outputs round these)."""
    per = values_per_block(wide)
    words = philox_blocks(seed, offset, -(-n // per), device)
    if kind == "uniform":
        if wide:
            x = _u53(words[:, 0::2], words[:, 1::2]).reshape(-1)[:n]
            u = x.to(torch.float64) * 2.0 ** -53
            lo, hi = (torch.tensor(v, dtype=torch.float64, device=device) for v in (a, b))
        else:
            u = (words.reshape(-1)[:n] >> 8).to(torch.float32) * 2.0 ** -24
            lo, hi = (torch.tensor(v, dtype=torch.float32, device=device) for v in (a, b))
        return torch.add(lo, torch.mul(u, torch.sub(hi, lo)))
    if kind != "normal":
        raise ValueError(f"no random distribution {kind!r}")
    if wide:
        u1 = (_u53(words[:, 0], words[:, 1]).to(torch.float64) + 1.0) * 2.0 ** -53
        u2 = _u53(words[:, 2], words[:, 3]).to(torch.float64) * 2.0 ** -53
    else:  # two pairs per block: elements 4j, 4j+1 use pair 0, 4j+2, 4j+3 pair 1
        u1 = (words[:, 0::2].reshape(-1).to(torch.float64) + 1.0) * 2.0 ** -32
        u2 = words[:, 1::2].reshape(-1).to(torch.float64) * 2.0 ** -32
    r = torch.sqrt(torch.log(u1) * -2.0)
    t = u2 * TWO_PI
    z = torch.stack([r * torch.cos(t), r * torch.sin(t)], dim=1).reshape(-1)[:n]
    out = torch.add(torch.tensor(a, dtype=torch.float64, device=device),
                    torch.mul(torch.tensor(b, dtype=torch.float64, device=device), z))
    return out if wide else out.to(torch.float32)
