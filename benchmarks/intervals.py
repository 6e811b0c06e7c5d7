"""How sure a measured speed ratio is: a percentile bootstrap of the ratio of two medians.

A step time varies by more than the gains we look for (one system's training step ranged from
10.2 to 13.0 ms within a run on the H100), so a ratio of medians alone can read 0.94x in one run
and 0.98x in the next. Each system's samples are drawn again with replacement, ``draws`` times,
and the middle ``confidence`` of the resampled ratios is the interval. The generator is seeded:
the same samples give the same interval.

The samples of two systems are resampled independently: the rounds of
``benchmarks.kernels.times_in_rounds`` already spread clock drift over both.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # median of ours over median of theirs
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.ratio:.3f}x ({self.low:.3f}-{self.high:.3f})"


def median_ratio_interval(ours: list[float], theirs: list[float], confidence: float = 0.95,
                          draws: int = 2000, seed: int = 0) -> RatioInterval:
    """The ratio of the medians of ``ours`` and ``theirs``, with its bootstrap interval."""
    if not ours or not theirs:
        raise ValueError("a ratio of medians needs samples on both sides")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(ours, k=len(ours)))
                    / statistics.median(rng.choices(theirs, k=len(theirs)))
                    for _ in range(draws))
    tail = (1 - confidence) / 2
    low = ratios[int(tail * (draws - 1))]
    high = ratios[int(round((1 - tail) * (draws - 1)))]
    return RatioInterval(statistics.median(ours) / statistics.median(theirs), low, high)
