"""Every plan option, declared once: its name, Python type, default, what values it takes (a
range, choices, a length or a pattern) and a one-line description.

Everything else is derived from ``PLAN_OPTIONS``: ``planner.PlanOptions`` (its defaults, and its
checks through ``checked``), ``segmenters.result.SolverOptions`` (the defaults of what the solvers
take), the HTTP request model ``service.models.PlanOptionsModel`` (pydantic fields and JSON Schema
constraints) and the command line's ``plan`` options (defaults, help, checks). A bound changed
here changes on every path; ``tests/optimizer/test_options.py`` holds them to it.

The service's ``max_solver_seconds`` is a deployment's own limit: it may lower ``time_limit_s``'s
range, never raise it (``service.settings``).

This module is the lowest layer (no pydantic, nothing from the service or the SDK) and imports
nothing heavy: the command line builds its options from it on every start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from types import MappingProxyType
from typing import Any, NoReturn

from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.kinds.kind import Kind
from fusecut.optimizer.profiles import DEFAULT_PROFILE, PROFILES


@dataclass(frozen=True)
class Range:
    """``low <= value <= high``, or ``low < value`` when ``low_open``."""

    low: int | float
    high: int | float
    low_open: bool = False

    def holds(self, value: int | float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high  # False for NaN

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{number_text(self.low)}, " \
               f"{number_text(self.high)}]"


@dataclass(frozen=True)
class Option:
    """One plan option. ``type`` is what ``PlanOptions`` holds: int, float, str, tuple (names
    drawn from ``choices``) or dict (named fields, each an Option in ``fields``)."""

    name: str
    type: type
    default: Any
    description: str
    range: Range | None = None  # int and float options
    choices: tuple[str, ...] = ()  # a str option is one of them; a tuple option draws from them
    ignore_case: bool = False  # choices matched in any case
    always: tuple[str, ...] = ()  # choices a tuple option may not leave out
    max_length: int | None = None  # str options
    pattern: str | None = None  # a regular expression the whole str value matches
    fields: tuple[Option, ...] = ()  # a dict option's fields, each optional

    def accepts(self) -> str:
        """What the option takes, in words (error messages and help)."""
        if self.type in (int, float):
            return f"{'an integer' if self.type is int else 'a number'} in {self.range}"
        if self.type is str:
            if self.choices:
                return f"one of {or_list(self.choices)}" + (" (any case)"
                                                            if self.ignore_case else "")
            if self.pattern:
                return f"a string matching {self.pattern}"
            return f"a string of at most {self.max_length} characters"
        if self.type is tuple:
            return f"a list drawn from {', '.join(self.choices)}, including " \
                   f"{and_list(self.always)}"
        return f"a mapping from some of {', '.join(f.name for f in self.fields)} to values"


def number_text(x: int | float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def or_list(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def and_list(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


SEGMENTER = Option(
    "segmenter", str, "cpsat",
    "how to segment: cpsat (a CP-SAT search started from the greedy plan), greedy (nvFuser-style "
    "merging) or mincut (min-cut refinement of the greedy plan)",
    choices=("cpsat", "greedy", "mincut"))
# 600 s: the planner has refused longer since it was written (the request model allowed 3600,
# but such a request failed there); a service lowers it with max_solver_seconds (60 by default).
TIME_LIMIT_S = Option("time_limit_s", float, 5.0, "solver seconds",
                      range=Range(0, 600, low_open=True))
# a name of any case; max_length keeps what a refusal echoes short
DEVICE = Option("device", str, DEFAULT_PROFILE, f"device profile: {or_list(tuple(PROFILES))}",
                choices=tuple(PROFILES), ignore_case=True, max_length=32)
# Each within what a GPU could have: bandwidth 1e-300 or sm_count 1e300 is refused, named.
DEVICE_FIELDS = (
    Option("bandwidth", float, None, "bytes/s", range=Range(1e9, 1e15)),
    Option("sm_count", int, None, "streaming multiprocessors", range=Range(1, 10_000)),
    Option("smem_per_block", int, None, "bytes", range=Range(1024, 2**24)),
    Option("launch_overhead_s", float, None, "seconds per kernel launch",
           range=Range(1e-8, 1e-1)),
    Option("persistent_budget", int, None, "bytes", range=Range(1024, 2**24)),
    Option("compute_rate", float, None, "fp32 ops/s", range=Range(1e9, 1e17)),
    Option("arch", str, None, "CUDA architecture, like sm_90", pattern=r"^sm_[0-9]{2,3}a?$"),
)
DEVICE_OVERRIDES = Option(
    "device_overrides", dict, MappingProxyType({}),
    "Fields of the device profile to replace, each within what a real GPU could have.",
    fields=DEVICE_FIELDS)
LAUNCH_WEIGHT = Option("launch_weight", float, 1.0,
                       "scales the per-kernel launch cost in the objective", range=Range(0, 1e6))
COMPUTE_WEIGHT = Option("compute_weight", float, 1.0,
                        "scales the recomputation term in the objective", range=Range(0, 1e6))
SEED = Option("seed", int, 0, "solver random seed (int32)", range=Range(0, 2**31 - 1))
# library and fallback segments are the only home of some ops (matmuls, ops without a kernel)
KINDS = Option("kinds", tuple, tuple(k.value for k in Kind), "segment kinds the plan may use",
               choices=tuple(k.value for k in Kind),
               always=(Kind.LIBRARY.value, Kind.FALLBACK.value))
NUM_STREAMS = Option("num_streams", int, 4,
                     "CUDA streams a stream-parallel loop cycles through (stream lowering)",
                     range=Range(1, 64))

# In the order of PlanOptions' fields, its JSON and the request model's properties.
PLAN_OPTIONS = (SEGMENTER, TIME_LIMIT_S, DEVICE, DEVICE_OVERRIDES, LAUNCH_WEIGHT, COMPUTE_WEIGHT,
                SEED, KINDS, NUM_STREAMS)
BY_NAME = {o.name: o for o in PLAN_OPTIONS}


def checked(option: Option, value: Any) -> Any:
    """``value`` in the option's type (an int given for a float option becomes a float, a list
    of kinds a tuple: equal options have equal JSON, and one plan key), or a PlanError naming
    the option, what it takes and what was given."""
    if option.type is not dict:
        return _checked_one(option, value, option.name)
    if not isinstance(value, Mapping):
        _refuse(option, option.name, value)
    known = {f.name: f for f in option.fields}  # each a number or a string: no deeper
    unknown = sorted(map(str, set(value) - set(known)))
    if unknown:
        _refuse(option, option.name, value, f"unknown: {', '.join(unknown)}")
    return {k: _checked_one(known[k], v, f"{option.name}.{k}") for k, v in value.items()}


def _checked_one(option: Option, value: Any, where: str) -> Any:
    """``checked`` for a number, string or tuple option, named ``where`` in a refusal."""
    if option.type in (int, float):
        number = Integral if option.type is int else Real
        if isinstance(value, bool) or not isinstance(value, number) or \
                not option.range.holds(value):  # NaN holds nothing
            _refuse(option, where, value)
        return option.type(value)
    if option.type is str:
        if not isinstance(value, str) or (option.max_length is not None
                                          and len(value) > option.max_length):
            _refuse(option, where, value)
        if option.choices and not _chosen(option, value):
            _refuse(option, where, value)
        if option.pattern is not None and not re.fullmatch(option.pattern, value):
            _refuse(option, where, value)
        return value
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        _refuse(option, where, value)
    names = tuple(value)
    if not all(isinstance(v, str) for v in names):
        _refuse(option, where, value)
    unknown = sorted(set(names) - set(option.choices))
    if unknown:
        _refuse(option, where, value, f"unknown: {', '.join(unknown)}")
    missing = tuple(c for c in option.always if c not in names)
    if missing:
        _refuse(option, where, value,
                f"{and_list(missing)} may not be left out (some ops have no other home)")
    return names


def _refuse(option: Option, where: str, value: Any, problem: str = "") -> NoReturn:
    given = repr(value)
    given = given if len(given) <= 80 else given[:76] + " ..."  # a message, not an echo
    raise PlanError(f"{where} must be {option.accepts()}, got {given}"
                    + (f": {problem}" if problem else ""))


def _chosen(option: Option, value: str) -> bool:
    if option.ignore_case:
        return value.casefold() in {c.casefold() for c in option.choices}
    return value in option.choices
