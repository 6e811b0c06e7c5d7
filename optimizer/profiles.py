"""Device profiles: the numbers the cost model and the kind rules use.

Bandwidths are what a large device-to-device copy reaches (bytes read plus written per second),
not datasheet peaks: the planner estimates time from them, and the floor of a fusion is its
lower-bound bytes over this bandwidth. ``persistent_budget`` is how many bytes of one row a
normalization kernel may keep on chip (registers and shared memory of one block).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from fusecut.optimizer.errors import PlanError


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    bandwidth: float  # bytes/s, copy bandwidth counting reads and writes
    sm_count: int
    smem_per_block: int  # bytes of shared memory a block may use (opt-in maximum)
    launch_overhead_s: float  # per kernel, as seen between back-to-back launches
    persistent_budget: int  # bytes of one row a persistent (normalization) kernel keeps on chip
    compute_rate: float  # simple fp32 ops per second, for the recomputation term
    arch: str = "sm_90"
    # vectors a thread of a normalization holds per row (a block per row): the loads it keeps
    # in flight. Measured (benchmarks.tiles --cases launches): 2 on the H100; on the H200, 4
    # takes layernorm_fwd from 0.85 to 0.92 of copy bandwidth and softmax_fwd from 0.90 to 0.94
    norm_vectors: int = 2

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Fields that tune the generated kernels to a device, measured there, rather than describe it
# to the cost model: a profile's, not a request's to override (optimizer.options.DEVICE_FIELDS).
TUNING_FIELDS = frozenset({"norm_vectors"})

PROFILES: dict[str, DeviceProfile] = {
    "H100": DeviceProfile("H100", bandwidth=2.94e12, sm_count=132, smem_per_block=227 * 1024,
                          launch_overhead_s=4e-6, persistent_budget=96 * 1024,
                          compute_rate=4.0e13, arch="sm_90"),
    "H200": DeviceProfile("H200", bandwidth=4.3e12, sm_count=132, smem_per_block=227 * 1024,
                          launch_overhead_s=4e-6, persistent_budget=96 * 1024,
                          compute_rate=4.0e13, arch="sm_90", norm_vectors=4),
    "A100": DeviceProfile("A100", bandwidth=1.7e12, sm_count=108, smem_per_block=163 * 1024,
                          launch_overhead_s=5e-6, persistent_budget=64 * 1024,
                          compute_rate=1.9e13, arch="sm_80"),
}
DEFAULT_PROFILE = "H100"


def profile_of_device(device_name: str) -> str | None:
    """The built-in profile of a GPU by its name (``torch.cuda.get_device_name``): "NVIDIA
    H200" -> "H200"; None for a GPU without one."""
    upper = device_name.upper()
    return next((name for name in PROFILES if name in upper), None)


def get_profile(name: str | None = None, overrides: dict[str, Any] | None = None) -> DeviceProfile:
    """A built-in profile by name (case-insensitive), with fields overridden per request."""
    key = (name or DEFAULT_PROFILE).upper()
    if key not in PROFILES:
        raise PlanError(f"unknown device profile {name!r}; built in: {', '.join(PROFILES)}")
    profile = PROFILES[key]
    if overrides:
        fields = set(DeviceProfile.__dataclass_fields__) - {"name"}
        unknown = set(overrides) - fields
        if unknown:
            raise PlanError(f"unknown device profile fields {sorted(unknown)}; "
                            f"known: {sorted(fields)}")
        for field, value in overrides.items():
            if field == "arch":
                if not isinstance(value, str) or not value.startswith("sm_"):
                    raise PlanError(f"device arch must look like 'sm_90', got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise PlanError(f"device profile field {field} must be a positive number, "
                                f"got {value!r}")
        profile = replace(profile, **overrides)
    return profile
