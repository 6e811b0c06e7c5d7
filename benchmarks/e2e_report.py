"""The end-to-end benchmark's results and tables: per-case times, ratios against nvFuser, their
geometric means, fractions of the floor, and host latency on tiny inputs. Pure: no GPU."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.common import markdown_table

NAN = math.nan
EXTRA_SEGMENT_ALLOWANCE_S = 10e-6  # issue 9: within 10 us of nvFuser per extra segment


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def ratio(num: float, den: float) -> float:
    """num / den, NaN when either is missing or den is not positive."""
    return num / den if finite(num) and finite(den) and den > 0 else NAN


def geomean(xs) -> float:
    """Geometric mean of the finite positive values; NaN when there are none."""
    vals = [x for x in xs if finite(x) and x > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else NAN


@dataclass
class Row:
    """One case on full-size inputs; times in seconds, NaN where not measured."""

    name: str
    memory_bound: bool = True
    lower_bound_bytes: int | None = None
    floor_s: float = NAN
    segments: int | None = None
    fusecut_e2e: float = NAN
    fusecut_kernels: float = NAN
    fusecut_launches: int | None = None
    nvfuser_e2e: float = NAN
    nvfuser_kernels: float = NAN
    nvfuser_launches: int | None = None
    compile_s: float = NAN
    eager_s: float = NAN
    notes: list[str] = field(default_factory=list)

    @property
    def e2e_ratio(self) -> float:
        """nvFuser e2e / fusecut e2e: above 1 means fusecut is faster."""
        return ratio(self.nvfuser_e2e, self.fusecut_e2e)

    @property
    def kernels_ratio(self) -> float:
        return ratio(self.nvfuser_kernels, self.fusecut_kernels)

    def of_floor(self, attr: str) -> float:
        """Floor time / measured time (1.0 is the floor)."""
        return ratio(self.floor_s, getattr(self, attr))


@dataclass
class TinyRow:
    """One case on tiny inputs: host latency per call, in seconds."""

    name: str
    shapes: str = ""
    segments: int | None = None
    fusecut_s: float = NAN
    nvfuser_s: float = NAN
    notes: list[str] = field(default_factory=list)

    @property
    def allowed_s(self) -> float:
        """nvFuser's time plus the allowance per extra fusecut segment (the issue's goal)."""
        if not finite(self.nvfuser_s) or self.segments is None:
            return NAN
        return self.nvfuser_s + EXTRA_SEGMENT_ALLOWANCE_S * max(self.segments - 1, 0)

    @property
    def goal_met(self) -> bool | None:
        if not (finite(self.fusecut_s) and finite(self.allowed_s)):
            return None
        return self.fusecut_s <= self.allowed_s


# (column title, Row attribute) of the fractions-of-the-floor table
FLOOR_COLUMNS = [("fusecut e2e", "fusecut_e2e"), ("fusecut kernels", "fusecut_kernels"),
                 ("nvFuser e2e", "nvfuser_e2e"), ("nvFuser kernels", "nvfuser_kernels"),
                 ("torch.compile", "compile_s"), ("eager", "eager_s")]


@dataclass(frozen=True)
class Systems:
    """Which peers the run measured: their columns appear only then."""

    nvfuser: bool
    compile: bool

    def floor_columns(self) -> list[tuple[str, str]]:
        return [(title, attr) for title, attr in FLOOR_COLUMNS
                if (self.nvfuser or not attr.startswith("nvfuser"))
                and (self.compile or attr != "compile_s")]


@dataclass
class Summary:
    e2e_geomean: float  # of nvFuser / fusecut over memory-bound cases nvFuser ran
    e2e_cases: int
    kernels_geomean: float
    kernels_cases: int
    wins_e2e: int  # cases where fusecut is faster end to end, of those nvFuser ran
    compared_e2e: int
    wins_vs_compile: int
    compared_vs_compile: int
    floor: dict[str, float]  # Row attribute -> geomean fraction of the floor, memory-bound cases


def summarize(rows: list[Row]) -> Summary:
    bound = [r for r in rows if r.memory_bound]
    e2e = [r.e2e_ratio for r in bound if finite(r.e2e_ratio)]
    kern = [r.kernels_ratio for r in bound if finite(r.kernels_ratio)]
    compared = [r for r in rows if finite(r.e2e_ratio)]
    vs_compile = [r for r in rows if finite(r.fusecut_e2e) and finite(r.compile_s)]
    return Summary(
        e2e_geomean=geomean(e2e), e2e_cases=len(e2e),
        kernels_geomean=geomean(kern), kernels_cases=len(kern),
        wins_e2e=sum(r.fusecut_e2e < r.nvfuser_e2e for r in compared),
        compared_e2e=len(compared),
        wins_vs_compile=sum(r.fusecut_e2e < r.compile_s for r in vs_compile),
        compared_vs_compile=len(vs_compile),
        floor={attr: geomean(r.of_floor(attr) for r in bound) for _, attr in FLOOR_COLUMNS})


def us(seconds: float, digits: int = 0) -> str:
    return f"{seconds * 1e6:.{digits}f}" if finite(seconds) else "-"


def num(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if finite(x) else "-"


def count(n: int | None) -> str:
    return "-" if n is None else str(n)


def times_table(rows: list[Row], systems: Systems) -> str:
    s = summarize(rows)
    nv, comp = systems.nvfuser, systems.compile
    headers = ["case", "lower bound MiB", "floor us", "segments",
               "kernels/call fusecut / nvFuser" if nv else "kernels/call",
               "fusecut e2e us", "fusecut kernels us"]
    headers += ["nvFuser e2e us", "nvFuser kernels us"] if nv else []
    headers += ["torch.compile us"] if comp else []
    headers += ["eager us"]
    headers += ["e2e nvFuser / fusecut", "kernels nvFuser / fusecut"] if nv else []
    headers += ["note"]
    body = []
    for r in rows:
        mib = "-" if r.lower_bound_bytes is None else f"{r.lower_bound_bytes / 2**20:.0f}"
        launches = count(r.fusecut_launches) + (f" / {count(r.nvfuser_launches)}" if nv else "")
        cells = [r.name, mib, us(r.floor_s), count(r.segments), launches,
                 us(r.fusecut_e2e), us(r.fusecut_kernels)]
        cells += [us(r.nvfuser_e2e), us(r.nvfuser_kernels)] if nv else []
        cells += [us(r.compile_s)] if comp else []
        cells += [us(r.eager_s)]
        cells += [num(r.e2e_ratio), num(r.kernels_ratio)] if nv else []
        notes = list(r.notes) + ([] if r.memory_bound else ["not memory-bound"])
        body.append(cells + ["; ".join(notes)])
    if nv:
        pad = [""] * (len(headers) - 4)  # case ... | e2e ratio | kernels ratio | note
        body.append(["geometric mean (memory-bound, where nvFuser ran)"] + pad
                    + [num(s.e2e_geomean), num(s.kernels_geomean),
                       f"{s.e2e_cases} cases e2e, {s.kernels_cases} kernels only"])
    return markdown_table(headers, body)


def floor_table(rows: list[Row], systems: Systems) -> str:
    s = summarize(rows)
    cols = systems.floor_columns()
    body = [[r.name] + [num(r.of_floor(attr)) for _, attr in cols]
            + ["" if r.memory_bound else "not memory-bound"] for r in rows]
    body.append(["geometric mean (memory-bound)"] + [num(s.floor[attr]) for _, attr in cols]
                + [""])
    return markdown_table(["case"] + [title for title, _ in cols] + ["note"], body)


def tiny_table(rows: list[TinyRow], nvfuser: bool) -> str:
    headers = ["case", "tiny inputs", "segments", "fusecut us/call"]
    headers += ["nvFuser us/call", "fusecut - nvFuser us", "allowed us", "goal met"] if nvfuser \
        else []
    headers += ["note"]
    body = []
    for r in rows:
        cells = [r.name, r.shapes, count(r.segments), us(r.fusecut_s, 1)]
        if nvfuser:
            met = {None: "-", True: "yes", False: "no"}[r.goal_met]
            cells += [us(r.nvfuser_s, 1), us(r.fusecut_s - r.nvfuser_s, 1)
                      if finite(r.fusecut_s) and finite(r.nvfuser_s) else "-",
                      us(r.allowed_s, 1), met]
        body.append(cells + ["; ".join(r.notes)])
    return markdown_table(headers, body)


def summary_lines(rows: list[Row], tiny: list[TinyRow], systems: Systems) -> list[str]:
    s = summarize(rows)
    out = []
    if systems.nvfuser and rows:
        out.append(f"fusecut faster than nvFuser end to end on {s.wins_e2e} of the "
                   f"{s.compared_e2e} cases nvFuser ran.")
        out.append(f"Geometric mean of nvFuser time / fusecut time (above 1: fusecut faster) over "
                   f"the memory-bound cases nvFuser ran: end to end {num(s.e2e_geomean)} "
                   f"({s.e2e_cases} cases), kernels only {num(s.kernels_geomean)} "
                   f"({s.kernels_cases} cases).")
    if systems.compile and s.compared_vs_compile:
        out.append(f"fusecut faster than torch.compile end to end on {s.wins_vs_compile} of "
                   f"{s.compared_vs_compile} cases.")
    judged = [r for r in tiny if r.goal_met is not None]
    if systems.nvfuser and judged:
        out.append(f"Tiny inputs: fusecut within the host-latency goal (at or below nvFuser, plus "
                   f"10 us per extra segment) on {sum(r.goal_met for r in judged)} of "
                   f"{len(judged)} cases.")
    return out


def render(rows: list[Row], tiny: list[TinyRow], systems: Systems) -> str:
    """The tables of a run, with their headings and the summary lines."""
    parts = []
    lines = summary_lines(rows, tiny, systems)
    if lines:
        parts.append("\n".join(f"- {line}" for line in lines))
    if rows:
        parts.append("## Full-size inputs: time per call\n\n" + times_table(rows, systems))
        parts.append("## Fractions of the floor (floor time / measured time; 1.0 is the floor)"
                     "\n\n" + floor_table(rows, systems))
    if tiny:
        parts.append("## Host latency on tiny inputs (every axis at most 16)\n\n"
                     + tiny_table(tiny, systems.nvfuser))
    return "\n\n".join(parts) + "\n"
