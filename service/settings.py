"""Service settings: embedded defaults, overridable by FUSECUT_* environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path


def _default_db() -> str:
    root = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(root) / "fusecut" / "plans.sqlite")


@dataclass(frozen=True)
class Settings:
    db_path: str = field(default_factory=_default_db)  # the plan cache (SQLite)
    cache_url: str | None = None  # or a postgresql:// URL (or SQLite path): overrides db_path
    cache_max_bytes: int = 512 * 1024**2  # the cache's bound: least recently used plans go
    cache_memory_items: int = 1024  # plans (and request keys) also kept in memory
    max_body_bytes: int = 256 * 1024 * 1024
    max_plan_body_bytes: int = 16 * 1024 * 1024  # POST /v1/plan carries no tensors
    max_ops: int = 20_000
    max_tensor_bytes: int = 2 * 1024**3  # per execute request, inputs together
    max_plan_tensor_bytes: int = 2**40  # per input of a plan, its logical extent (1 TiB)
    max_solver_seconds: float = 60.0
    default_time_limit_s: float = 5.0
    max_queued_executions: int = 16  # per GPU worker, running or waiting; then 503 Retry-After
    gpus: str | None = None  # "all" or "0,1,...": a worker per device (default: one worker)
    max_concurrent_plans: int = 4
    execute_timeout_s: float = 120.0
    api_key: str | None = None  # when set, /v1/execute needs "Authorization: Bearer <key>"
    worker: bool = True  # run executions in a separate worker process
    recent_plans: int = 20  # shown on the dashboard

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
                    raise ValueError(f"{name} must be a number ({f.type}), got {raw!r}") from None
            elif f.type in ("bool",):
                values[f.name] = raw.lower() not in ("0", "false", "no", "")
            else:
                values[f.name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
