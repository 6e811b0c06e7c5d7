"""The Regions a test's compile made: the serial of the newest Region before it, and every live
Region made after that serial."""

from __future__ import annotations

import fusecut.dynamo


def last_serial() -> int:
    return max((r.serial for r in fusecut.dynamo.regions.live_regions()), default=-1)


def regions_since(serial: int) -> list:
    return [r for r in fusecut.dynamo.regions.live_regions() if r.serial > serial]
