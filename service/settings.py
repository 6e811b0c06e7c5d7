"""Service settings: one field per ``FUSECUT_*`` variable of the service, each declared (type,
default, meaning) in ``fusecut.environment``'s table and read through it (``Settings.from_env``).

Every setting is checked when the settings are made (so at start): a number must parse as its
type, be finite and lie in its range (``LOWEST``); a boolean is one of ``TRUE`` or ``FALSE``
(the environment's one rule); a cache location names a scheme the service knows. A bad value is
one line naming the variable (``SettingError``), never a service that starts and then
misbehaves (issue 45: a body rate of 0 dropped every body, a NaN timeout never answered,
``FUSECUT_WORKER=off`` turned workers on).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

from fusecut import environment
from fusecut.environment import FALSE, TRUE, VariableError  # noqa: F401 (the one rule)
from fusecut.optimizer.options import TIME_LIMIT_S, Range

# the least value of each number, and whether that value itself is refused (a timeout of 0)
LOWEST: dict[str, tuple[float, bool]] = {
    "cache_max_bytes": (1, False), "cache_memory_items": (0, False),
    "cache_timeout_s": (0, True), "max_body_bytes": (1, False),
    "max_plan_body_bytes": (1, False), "max_json_body_bytes": (1, False), "max_ops": (1, False),
    "max_tensor_bytes": (1, False), "max_plan_tensor_bytes": (1, False),
    "workers_per_device": (1, False), "max_concurrent_plans": (1, False),
    "max_queued_executions": (0, False), "max_queued_plans": (0, False),
    "queue_wait_s": (0, True), "max_requests_per_client": (0, False),
    "plan_grace_s": (0, False), "execute_timeout_s": (0, True), "max_output_bytes": (1, False),
    "max_intermediate_bytes": (1, False), "read_timeout_s": (0, True),
    "header_timeout_s": (0, True), "min_body_rate": (1, False), "max_header_count": (1, False),
    "max_header_bytes": (1, False), "max_connections": (1, False), "recent_plans": (0, False),
}
CACHE_SCHEMES = ("postgresql://", "postgres://", "sqlite://")

# a setting's value refused: one line naming its environment variable (the environment's error,
# whether the value came from the environment or from a caller)
SettingError = VariableError


def variable(name: str) -> str:
    return f"FUSECUT_{name.upper()}"


def env_default(name: str):
    """A field defaulting to its variable's declared default (fusecut.environment)."""
    return field(default_factory=lambda: environment.default(variable(name)))


@dataclass(frozen=True)
class Settings:
    """The service's settings; what each means: fusecut.environment.VARIABLES (and
    docs/service.md#settings). Executions run in worker processes, each one at a time:
    ``workers_per_device`` per device listed in ``gpus``; two per device overlap one
    execution's host work with another's kernels. ``max_solver_seconds`` may only lower the
    time_limit_s option's declared bound, never raise it."""

    db_path: str = env_default("db_path")
    cache_url: str | None = env_default("cache_url")
    cache_max_bytes: int = env_default("cache_max_bytes")
    cache_memory_items: int = env_default("cache_memory_items")
    cache_timeout_s: float = env_default("cache_timeout_s")
    max_body_bytes: int = env_default("max_body_bytes")
    max_plan_body_bytes: int = env_default("max_plan_body_bytes")
    max_json_body_bytes: int = env_default("max_json_body_bytes")
    max_ops: int = env_default("max_ops")
    max_tensor_bytes: int = env_default("max_tensor_bytes")
    max_plan_tensor_bytes: int = env_default("max_plan_tensor_bytes")
    max_solver_seconds: float = env_default("max_solver_seconds")
    default_time_limit_s: float = env_default("default_time_limit_s")
    gpus: str | None = env_default("gpus")
    workers_per_device: int = env_default("workers_per_device")
    max_concurrent_plans: int = env_default("max_concurrent_plans")
    max_queued_executions: int = env_default("max_queued_executions")
    max_queued_plans: int = env_default("max_queued_plans")
    queue_wait_s: float = env_default("queue_wait_s")
    max_requests_per_client: int = env_default("max_requests_per_client")
    plan_grace_s: float = env_default("plan_grace_s")
    execute_timeout_s: float = env_default("execute_timeout_s")
    max_output_bytes: int = env_default("max_output_bytes")
    max_intermediate_bytes: int = env_default("max_intermediate_bytes")
    read_timeout_s: float = env_default("read_timeout_s")
    header_timeout_s: float = env_default("header_timeout_s")
    min_body_rate: int = env_default("min_body_rate")
    max_header_count: int = env_default("max_header_count")
    max_header_bytes: int = env_default("max_header_bytes")
    max_connections: int = env_default("max_connections")
    api_key: str | None = env_default("api_key")
    metrics_need_key: bool = env_default("metrics_need_key")
    cors_origins: str = env_default("cors_origins")
    allowed_hosts: str = env_default("allowed_hosts")
    worker: bool = env_default("worker")
    recent_plans: int = env_default("recent_plans")

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in LOWEST:
                low, open_ = LOWEST[f.name]
                if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                        not math.isfinite(value) or value < low or (open_ and value == low):
                    bound = f"greater than {low:g}" if open_ else f"at least {low:g}"
                    raise SettingError(f"{variable(f.name)} must be a finite number {bound}, "
                                       f"got {value!r}")
            elif f.type == "bool" and not isinstance(value, bool):
                raise SettingError(f"{variable(f.name)} must be true or false, got {value!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise SettingError("FUSECUT_API_KEY is blank: give a key, or leave it unset (or "
                               "empty) to serve without one")
        if self.cache_url and re.match(r"[a-z][a-z0-9+.-]*://", self.cache_url, re.IGNORECASE) \
                and not self.cache_url.startswith(CACHE_SCHEMES):
            from fusecut.service.cache.store import redact

            raise SettingError(f"FUSECUT_CACHE_URL must be an SQLite path, sqlite:///PATH or "
                               f"postgresql://..., got {redact(self.cache_url)!r}")
        if self.cache_url and self.cache_url.startswith(CACHE_SCHEMES[:2]):
            import importlib.util

            if importlib.util.find_spec("psycopg_pool") is None:  # `make run` leaves it out
                raise SettingError("FUSECUT_CACHE_URL names PostgreSQL, whose driver is not "
                                   "installed: pip install 'fusecut[postgres]'")
        declared = TIME_LIMIT_S.range
        if not declared.holds(self.max_solver_seconds):
            raise SettingError(f"max_solver_seconds (FUSECUT_MAX_SOLVER_SECONDS) must be in "
                             f"{declared}, the time_limit_s option's range: a service may lower "
                             f"it, not raise it; got {self.max_solver_seconds:g}")
        allowed = Range(declared.low, self.max_solver_seconds, declared.low_open)
        if not allowed.holds(self.default_time_limit_s):
            raise SettingError(f"default_time_limit_s (FUSECUT_DEFAULT_TIME_LIMIT_S) must be in "
                             f"{allowed}, within max_solver_seconds; got "
                             f"{self.default_time_limit_s:g}")

    @property
    def cache_location(self) -> str:
        return self.cache_url or self.db_path

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        """Each field from its variable (fusecut.environment.read: unset or set empty, the
        declared default), then ``overrides`` that are not None."""
        values = {f.name: environment.read(variable(f.name)) for f in fields(cls)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
