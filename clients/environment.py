"""The process environment: every ``FUSECUT_*`` variable fusecut reads, declared once.

``VARIABLES`` is the table: each variable's name, type, default, meaning and the module that
reads it (docs/service.md#settings lists the same, and a test holds the two together). Every
module reads its variables here (``read``, ``flag``, ``path``), never from ``os.environ``:

- one rule for booleans: ``TRUE`` or ``FALSE``, in any case; another spelling is an error naming
  the variable and the spellings, never a silent on or off (``FUSECUT_WORKER=off`` turned
  workers on, ``FUSECUT_COMPILE_AHEAD=false`` left compiling ahead on);
- a variable set empty counts as unset (compose's ``${X:-}``), a boolean set blank too;
- a number that does not parse is an error naming the variable (``VariableError``); ranges are
  the reader's (the service's settings check theirs);
- reading a name the table does not declare is a programming error (``KeyError``);
- per-user folders follow XDG: ``user_data_dir()`` (the service's plan cache) and
  ``user_cache_dir()`` (compiled kernels, the fusion cache's workspace).

A leaf: it imports nothing of fusecut but the version, so any layer may import it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from fusecut import version

# a boolean's spellings, any case: one rule for every boolean variable
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class VariableError(ValueError):
    """A variable's value refused: one line, naming the variable."""


def _xdg(name: str, fallback: str) -> Path:
    """An XDG base directory: the variable when it holds an absolute path (the specification
    ignores a relative one), else its default under the home folder."""
    value = os.environ.get(name, "")
    return Path(value) if os.path.isabs(value) else Path.home() / fallback


def user_data_dir() -> Path:
    """fusecut's per-user data folder: ``$XDG_DATA_HOME/fusecut`` (``~/.local/share``)."""
    return _xdg("XDG_DATA_HOME", ".local/share") / "fusecut"


def user_cache_dir() -> Path:
    """fusecut's per-user cache folder: ``$XDG_CACHE_HOME/fusecut`` (``~/.cache``)."""
    return _xdg("XDG_CACHE_HOME", ".cache") / "fusecut"


def install_tag() -> str:
    """This install's own folder under the per-user data folder: fusecut's version, and which
    checkout or environment it is (a digest of where the package lives). The default plan
    cache was one file for every checkout and version: a new version could serve an old plan
    (issue 32)."""
    where = str(Path(__file__).resolve().parent)
    return f"{version.__version__}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Variable:
    name: str
    type: type  # bool, int, float, str or Path
    default: object  # the value when unset; a function: computed then; None: no value
    reader: str  # the module that reads it
    meaning: str


SERVICE = "fusecut.service.settings"  # the service's settings: Settings.<name without FUSECUT_>
MiB, GiB = 1024**2, 1024**3


def _service(name: str, type_: type, default: object, meaning: str) -> Variable:
    return Variable(name, type_, default, SERVICE, meaning)


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    # the service (fusecut serve, fusecut ray-serve)
    _service("FUSECUT_DB_PATH", str,
             lambda: str(user_data_dir() / install_tag() / "plans.sqlite"),
             "the plan cache, an SQLite file: one per version and checkout"),
    _service("FUSECUT_CACHE_URL", str, None,
             "the plan cache as an SQLite path or postgresql:// URL; overrides the db path"),
    _service("FUSECUT_CACHE_MAX_BYTES", int, 512 * MiB,
             "the plan cache's bound: least recently used plans go"),
    _service("FUSECUT_CACHE_MEMORY_ITEMS", int, 1024,
             "plans (and request keys) also kept in memory"),
    _service("FUSECUT_CACHE_TIMEOUT_S", float, 1.0,
             "the longest one call on the plan cache may take; then it counts as degraded"),
    _service("FUSECUT_MAX_BODY_BYTES", int, 256 * MiB, "the largest request body"),
    _service("FUSECUT_MAX_PLAN_BODY_BYTES", int, 16 * MiB,
             "the largest POST /v1/plan body (it carries no tensors)"),
    _service("FUSECUT_MAX_JSON_BODY_BYTES", int, 32 * MiB,
             "the largest KServe-v2 JSON body (its values become Python objects)"),
    _service("FUSECUT_MAX_OPS", int, 20_000, "the most ops a definition may have"),
    _service("FUSECUT_MAX_TENSOR_BYTES", int, 2 * GiB,
             "an execute request's input tensors together"),
    _service("FUSECUT_MAX_PLAN_TENSOR_BYTES", int, 2**40,
             "each input of a plan, at its logical extent"),
    _service("FUSECUT_MAX_SOLVER_SECONDS", float, 60.0,
             "the largest time_limit_s a request may ask for (within the option's bound)"),
    _service("FUSECUT_DEFAULT_TIME_LIMIT_S", float, 5.0,
             "time_limit_s when a request gives none (the option's declared default)"),
    _service("FUSECUT_GPUS", str, None,
             "all, or device indices 0,1,... to run workers on; unset: the visible devices"),
    _service("FUSECUT_WORKERS_PER_DEVICE", int, 2,
             "worker processes per device, each one execution at a time"),
    _service("FUSECUT_MAX_CONCURRENT_PLANS", int, 4, "planner processes"),
    _service("FUSECUT_MAX_QUEUED_EXECUTIONS", int, 8,
             "executions waiting for a worker, all workers together (then 503)"),
    _service("FUSECUT_MAX_QUEUED_PLANS", int, 16, "plans waiting for a planner (then 503)"),
    _service("FUSECUT_QUEUE_WAIT_S", float, 30.0,
             "the longest a request waits for a slot (then 503)"),
    _service("FUSECUT_MAX_REQUESTS_PER_CLIENT", int, 0,
             "requests running or waiting per client (then 429); 0: no limit"),
    _service("FUSECUT_PLAN_GRACE_S", float, 10.0,
             "a planning job is cancelled this long past its time limit"),
    _service("FUSECUT_EXECUTE_TIMEOUT_S", float, 120.0,
             "the longest an execution may run (then 504)"),
    _service("FUSECUT_MAX_OUTPUT_BYTES", int, 256 * MiB,
             "what one execution returns, outputs together"),
    _service("FUSECUT_MAX_INTERMEDIATE_BYTES", int, 8 * GiB,
             "computed tensors alive at once, together"),
    _service("FUSECUT_READ_TIMEOUT_S", float, 15.0,
             "a request that sends nothing for this long is dropped"),
    _service("FUSECUT_HEADER_TIMEOUT_S", float, 20.0,
             "a request line and headers must all arrive within this"),
    _service("FUSECUT_MIN_BODY_RATE", int, 500,
             "bytes a second a body must average, past the read timeout"),
    _service("FUSECUT_MAX_HEADER_COUNT", int, 100, "headers a request may have"),
    _service("FUSECUT_MAX_HEADER_BYTES", int, 65_536,
             "what a request line and headers may take together"),
    _service("FUSECUT_MAX_CONNECTIONS", int, 1000,
             "connections open at once (kept under the open files limit)"),
    _service("FUSECUT_API_KEY", str, None,
             "when set, every /v1 route and /dashboard need 'Authorization: Bearer <key>'"),
    _service("FUSECUT_METRICS_NEED_KEY", bool, False, "and with this, /metrics too"),
    _service("FUSECUT_CORS_ORIGINS", str, "",
             "browser origins allowed to call the API, comma-separated"),
    _service("FUSECUT_ALLOWED_HOSTS", str, "",
             "host names requests may use besides loopback ones, comma-separated; *: any"),
    _service("FUSECUT_WORKER", bool, True, "run executions in separate worker processes"),
    _service("FUSECUT_RECENT_PLANS", int, 20, "plans shown on the dashboard"),
    # every process that runs fusions (the SDK, the CLI, the service's workers, Thunder)
    Variable("FUSECUT_CACHE_DIR", Path, lambda: user_cache_dir() / "kernels",
             "fusecut.runtime.compile",
             "compiled kernels (cubins) and in-process plans (plans/); the native launcher "
             "builds beside it"),
    Variable("FUSECUT_PLANS_ON_DISK", bool, True, "fusecut.runtime.plan_files",
             "keep in-process plans in the cache folder: a script's next run restores them"),
    Variable("FUSECUT_NATIVE", bool, True, "fusecut.runtime.launcher",
             "warm calls through the C++ launcher (false: the Python path)"),
    Variable("FUSECUT_COMPILE_AHEAD", bool, True, "fusecut.runtime.ahead",
             "compile a Thunder region's kernels in the background as it is traced"),
    Variable("FUSECUT_THUNDER_FAST_TRACING", bool, True, "fusecut.thunder.fast_tracing",
             "fusecut's shortcuts in Thunder's interpreter (false: Thunder as it ships)"),
    Variable("FUSECUT_FUSION_CACHE", Path, lambda: user_cache_dir() / "fusion_cache.json",
             "fusecut.fusion_cache",
             "where FusionCache's automatic serialization saves at exit and loads"),
)}


def declared(name: str) -> Variable:
    """``name``'s declaration; an undeclared name is a programming error."""
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in fusecut.environment.VARIABLES") from None


def default(name: str) -> object:
    """``name``'s value when it is unset."""
    value = declared(name).default
    return value() if callable(value) else value


def read(name: str) -> object:
    """``name``'s value, as its declared type; its default when unset or set empty."""
    var = declared(name)
    raw = os.environ.get(name, "")
    if raw == "" or (var.type is bool and raw.strip() == ""):
        return default(name)
    if var.type is bool:
        spelling = raw.strip().lower()
        if spelling not in TRUE + FALSE:
            raise VariableError(f"{name} must be one of {', '.join(TRUE)} (true) or "
                                f"{', '.join(FALSE)} (false), got {raw!r}")
        return spelling in TRUE
    if var.type in (int, float):
        try:
            return var.type(raw)
        except ValueError:
            raise VariableError(f"{name} must be a number ({var.type.__name__}), got "
                                f"{raw!r}") from None
    return var.type(raw)


def _typed(name: str, expected: type) -> object:
    if declared(name).type is not expected:
        raise TypeError(f"{name} is declared {declared(name).type.__name__}, not "
                        f"{expected.__name__}")
    return read(name)


def flag(name: str) -> bool:
    """A boolean variable's value (the one rule: ``TRUE`` or ``FALSE``)."""
    return _typed(name, bool)  # type: ignore[return-value]


def path(name: str) -> Path:
    """A path variable's value (its default: under a per-user folder)."""
    return _typed(name, Path)  # type: ignore[return-value]


def check() -> None:
    """Read every declared variable: the first bad value raises ``VariableError`` (``fusecut
    serve`` checks at start, not in a worker's first execution)."""
    for name in VARIABLES:
        read(name)


def unknown() -> list[str]:
    """One line per ``FUSECUT_*`` variable set in this process that fusecut does not declare (a
    misspelling: ``FUSECUT_WORKERS=off`` changes nothing), with the declared name it is closest
    to. Said, not refused: a newer fusecut's variable in an older one's environment is no error."""
    import difflib

    lines = []
    for name in sorted(n for n in os.environ if n.startswith("FUSECUT_") and n not in VARIABLES):
        close = difflib.get_close_matches(name, VARIABLES, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"{name} is not a fusecut setting{hint}: it changes nothing")
    return lines


def snapshot() -> dict[str, str]:
    """The declared variables set in this process, as set (for processes elsewhere: Ray's
    replicas)."""
    return {name: os.environ[name] for name in VARIABLES if name in os.environ}


def export(name: str, value: str) -> None:
    """Set a declared variable for this process and the ones it starts (``fusecut serve``'s
    options reach uvicorn's workers so)."""
    declared(name)
    os.environ[name] = value
