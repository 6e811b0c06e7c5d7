"""Service settings: embedded defaults, overridable by FUSECUT_* environment variables.

Every setting is checked when the settings are made (so at start): a number must parse as its
type, be finite and lie in its range (``LOWEST``); a boolean is one of ``TRUE`` or ``FALSE``; a
cache location names a scheme the service knows. A bad value is one line naming the variable
(``SettingError``), never a service that starts and then misbehaves (issue 45: a body rate of 0
dropped every body, a NaN timeout never answered, ``FUSECUT_WORKER=off`` turned workers on).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from fusecut.optimizer.options import TIME_LIMIT_S, Range


def install_tag() -> str:
    """This install's own folder under the per-user data folder: fusecut's version, and which
    checkout or environment it is (a digest of where the package lives). The default plan
    cache was one file for every checkout and version: a new version could serve an old plan
    (issue 32)."""
    from fusecut.version import __version__

    where = str(Path(__file__).resolve().parents[1])
    return f"{__version__}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"


# a boolean's spellings, any case (one rule for every boolean setting); set empty it is unset
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
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


class SettingError(ValueError):
    """A setting's value refused: one line, naming its environment variable."""


def variable(name: str) -> str:
    return f"FUSECUT_{name.upper()}"


def _default_db() -> str:
    root = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(root) / "fusecut" / install_tag() / "plans.sqlite")


@dataclass(frozen=True)
class Settings:
    db_path: str = field(default_factory=_default_db)  # the plan cache (SQLite), one per
    # version and checkout
    cache_url: str | None = None  # or a postgresql:// URL (or SQLite path): overrides db_path
    cache_max_bytes: int = 512 * 1024**2  # the cache's bound: least recently used plans go
    cache_memory_items: int = 1024  # plans (and request keys) also kept in memory
    # the longest one call on the plan cache may take (a connection, a statement, a lock
    # wait): then the cache counts as degraded and requests are served without it
    cache_timeout_s: float = 1.0
    max_body_bytes: int = 256 * 1024 * 1024
    max_plan_body_bytes: int = 16 * 1024 * 1024  # POST /v1/plan carries no tensors
    # a KServe-v2 JSON body: its values become Python objects as it is read (a 40 MB body grew
    # a planner process by 914 MB); larger tensors travel as safetensors
    max_json_body_bytes: int = 32 * 1024 * 1024
    max_ops: int = 20_000
    max_tensor_bytes: int = 2 * 1024**3  # per execute request, inputs together
    max_plan_tensor_bytes: int = 2**40  # per input of a plan, its logical extent (1 TiB)
    # A deployment's limits on the time_limit_s option: at most this (it may only lower the
    # option's declared bound, never raise it), and this when a request gives none (the
    # declared default unless set).
    max_solver_seconds: float = 60.0
    default_time_limit_s: float = TIME_LIMIT_S.default
    # Executions run in worker processes, each one at a time: ``workers_per_device`` per device
    # listed in ``gpus`` ("all" or "0,1,..."), or that many on whatever devices the service sees
    # without it. Two per device overlap one execution's host work with another's kernels.
    gpus: str | None = None
    workers_per_device: int = 2
    max_concurrent_plans: int = 4  # planner processes
    max_queued_executions: int = 8  # waiting for a worker, all workers together (beyond those
    # running); more are answered 503 with Retry-After
    max_queued_plans: int = 16  # waiting for a planner; more are answered 503
    queue_wait_s: float = 30.0  # the longest a request waits for a slot (then 503)
    max_requests_per_client: int = 0  # running or waiting per client (API key or address);
    # more are answered 429. 0: no limit
    plan_grace_s: float = 10.0  # a planning job is cancelled this long past its time limit
    execute_timeout_s: float = 120.0
    max_output_bytes: int = 256 * 1024 * 1024  # what one execution returns, outputs together
    max_intermediate_bytes: int = 8 * 1024**3  # computed tensors alive at once, together
    read_timeout_s: float = 15.0  # a request that sends nothing for this long is dropped
    header_timeout_s: float = 20.0  # a request line and headers must all arrive within this
    min_body_rate: int = 500  # bytes a second a body must average, past read_timeout_s
    max_header_count: int = 100  # headers a request may have
    max_header_bytes: int = 65_536  # what its request line and headers may take together
    max_connections: int = 1000  # connections open at once (kept under the open files limit)
    api_key: str | None = None  # when set, every /v1 route and /dashboard need "Authorization:
    # Bearer <key>"
    metrics_need_key: bool = False  # and with this, /metrics too
    cors_origins: str = ""  # browser origins allowed to call the API, comma-separated
    # Host names requests may use besides loopback ones (localhost, 127.0.0.1, ::1), comma-
    # separated; "*": any. Others are refused (a page rebinding its name to this address).
    allowed_hosts: str = ""
    worker: bool = True  # run executions in separate worker processes
    recent_plans: int = 20  # shown on the dashboard

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
        values = {}
        for f in fields(cls):
            name = f"FUSECUT_{f.name.upper()}"
            raw = os.environ.get(name)
            if raw is None or (raw == "" and "None" in str(f.type)):
                continue  # unset, or set empty for an optional one (compose's ${X:-})
            if f.type in ("int", "float"):
                try:
                    values[f.name] = int(raw) if f.type == "int" else float(raw)
                except ValueError:
                    raise SettingError(f"{name} must be a number ({f.type}), got "
                                       f"{raw!r}") from None
            elif f.type in ("bool",):
                if raw.strip() == "":
                    continue  # set empty: unset
                if raw.strip().lower() not in TRUE + FALSE:
                    raise SettingError(f"{name} must be one of {', '.join(TRUE)} (true) or "
                                       f"{', '.join(FALSE)} (false), got {raw!r}")
                values[f.name] = raw.strip().lower() in TRUE
            else:
                values[f.name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
