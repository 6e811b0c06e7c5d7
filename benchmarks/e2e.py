"""End-to-end benchmark (GPU): every corpus case at full size, timed in one process through
fusecut's public ``fd.execute``, fusecut's kernels alone, the real nvFuser (``fd.execute`` of
nvfuser_direct, end to end and kernels alone), torch.compile and eager, against the floor; then
host latency on tiny inputs (every axis at most 16) for fusecut and nvFuser.

Run from the repo root on a GPU box; for the nvFuser columns, first ``source .nvf/setup.sh``
(packed by ../shared/tools/nvfuser-anchor.sh). Without nvfuser_direct the nvFuser columns are
left out, with a note saying why.

    python -m benchmarks.e2e [--cases a,b] [--iters 50] [--tiny-iters 200]
        [--profile-calls 5] [--no-compile] [--no-nvfuser] [--tiny-only] [--budget-s 400]
        [--nvfuser-skip many_segments_stress] [--nvfuser-first-call-s 90]

Method. Every system gets the same input tensors: the repro's own, as the nvFuser anchor builds
them (torch.manual_seed(0) first), or, where nvFuser cannot define the case, tensors made from the
parsed metadata with the same seed. Each system is called once first (planning and compilation
are excluded) and its first-call time logged.
1. Full size: CUDA events around each call (record, call, record, synchronize); the median of
   ``--iters`` warm calls per system, in 5 rounds whose order rotates so that drift falls on all
   alike (benchmarks.kernels.medians_in_rounds).
2. Tiny inputs: the same, ``--tiny-iters`` calls each, for fusecut and nvFuser only.
3. Kernels alone: the sum of device activity (kernels, and memsets/memcpys the call launched)
   of one call, from torch.profiler, the median of ``--profile-calls`` calls; the kernel count
   beside it. All profiling happens last, in one session: CUPTI can stay attached after a
   session and would slow the launches that phases 1 and 2 time.
The floor is the logical lower bound (inputs read once, outputs written once) over the copy
bandwidth measured in the same process. The run stops starting full-size cases after 65% of
``--budget-s`` and tiny cases after 85% (rows say "not run"), and writes its tables to
benchmarks/results/e2e-<device>-<date>.md after every phase, so a run cut short keeps its table.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

import fusecut
from benchmarks.common import CORPUS, write_result
from benchmarks.e2e_report import Row, Systems, TinyRow, render
from benchmarks.kernel_profile import profile_calls
from benchmarks.kernels import (
    NOT_MEMORY_BOUND,
    copy_bandwidth,
    eager_function,
    logical_lower_bound,
    medians_in_rounds,
)
from benchmarks.nvfuser_peer import NvFuser, describe, first_call, load_nvfuser
from benchmarks.tiny_inputs import shapes_text, shrink_meta
from fusecut.runtime.tensors import make_input

NVFUSER_SKIP = ("many_segments_stress",)  # nvFuser's first call took minutes (corpus README)
# Cases whose eager peer torch.compile is not given, and why (the row's note says it).
COMPILE_SKIP = {
    "bias_dropout_add_layernorm": "its eager peer draws fusecut's Philox numbers in torch code "
    "(33 ms a call), and torch.compile's warm-up of it did not end within 290 s on the H100",
}
HEAVY_LAST = ("many_pointwise_chain", "many_segments_stress")  # the longest compiles run last
FULL_SHARE, TINY_SHARE = 0.65, 0.85  # of --budget-s: when the phases stop starting cases
ROUNDS = 5
OUT_OF_BUDGET = "not run: the run's time budget (--budget-s) ran out"
TITLE = "End-to-end benchmark: fusecut, nvFuser, torch.compile, eager"


# ---- run state ----------------------------------------------------------------------------------

@dataclass
class Clock:
    budget_s: float
    start: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def past(self, share: float) -> bool:
        return self.elapsed() > share * self.budget_s

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", flush=True)


@dataclass
class Options:
    iters: int = 50
    tiny_iters: int = 200
    profile_calls: int = 5
    compile: bool = True
    nvfuser_skip: tuple[str, ...] = NVFUSER_SKIP
    nvfuser_first_call_s: float = 90.0


@dataclass
class Peer:
    """nvFuser for this run; ``stuck`` names a first call left running, after which nvFuser is
    not called again (it would compete with every later measurement)."""

    nvfuser: NvFuser | None
    reason: str = ""  # why nvFuser is absent
    stuck: str = ""
    straggler: Any = None  # the thread of that first call

    def usable(self) -> bool:
        return self.nvfuser is not None and not self.stuck

    def background_note(self) -> list[str]:
        alive = self.straggler is not None and self.straggler.is_alive()
        return ["measured while a stuck nvFuser first call ran in the background"] if alive \
            else []


@dataclass
class Case:
    name: str
    parsed: Any
    inputs: list[Any]
    fusecut: Any  # fusecut.FusionDefinition
    nvfuser: Any  # nvFuser FusionDefinition, or None
    row: Row
    fusecut_ok: bool = False
    nvfuser_ok: bool = False  # its full-size first call ran


# ---- cases ------------------------------------------------------------------------------------

def corpus_names() -> list[str]:
    names = sorted(p.stem for p in CORPUS.glob("*.py"))
    return [n for n in names if n not in HEAVY_LAST] + [n for n in HEAVY_LAST if n in names]


def prepare(name: str, peer: Peer, opts: Options, full_inputs: bool = True) -> Case:
    """Parse the case, define it in nvFuser (whose anchor also builds the repro's inputs), and
    the inputs every system shares."""
    path = CORPUS / f"{name}.py"
    parsed = fusecut.load(path)
    if parsed.inputs is None:
        raise ValueError(f"{path} has no `inputs = [...]` list to take sizes from")
    row = Row(name, memory_bound=name not in NOT_MEMORY_BOUND)
    nvf, inputs = None, None
    if peer.nvfuser is not None:
        if name in opts.nvfuser_skip:
            row.notes.append("nvFuser not run (--nvfuser-skip)")
        elif peer.stuck:
            row.notes.append(f"nvFuser not run (stopped after {peer.stuck})")
        else:
            torch.manual_seed(0)
            try:
                nvf, inputs = peer.nvfuser.define(path)
            except Exception as exc:
                row.notes.append(f"nvFuser cannot define it ({describe(exc)})")
    if inputs is None and full_inputs:
        torch.manual_seed(0)
        inputs = [make_input(m, "cuda") for m in parsed.inputs]
    fd = fusecut.FusionDefinition.from_fusion(parsed.fusion)
    return Case(name, parsed, list(inputs or []) if full_inputs else [], fd, nvf, row)


def synced(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        fn()
        torch.cuda.synchronize()
    return run


def start_nvfuser(case: Case, inputs: list[Any], peer: Peer, opts: Options, clock: Clock,
                  what: str) -> str:
    """nvFuser's first call on ``inputs`` under the budget: '' when it ran, else why not.

    It runs in a worker thread (so that the wait can end); an error there is retried once in
    this thread, in case it came from the thread itself rather than from nvFuser."""
    device = torch.cuda.current_device()

    def call() -> None:
        torch.cuda.set_device(device)  # makes the device's context current in this thread
        case.nvfuser.execute(inputs)
        torch.cuda.synchronize()

    result = first_call(call, opts.nvfuser_first_call_s)
    if not result.finished:
        peer.stuck, peer.straggler = f"{case.name} ({what})", result.thread
        clock.log(f"  nvFuser {what}: {result.error}; nvFuser is not called again this run")
        return f"{result.error}; nvFuser not called again"
    if not result.ok:
        clock.log(f"  nvFuser {what} in a worker thread: {result.error}; again in this one")
        result = first_call(call, None)
        if not result.ok:
            clock.log(f"  nvFuser {what}: {result.error}")
            return result.error
    clock.log(f"  nvFuser first call ({what}) {result.seconds:.1f} s")
    return ""


def time_systems(named: list[tuple[str, Callable[[], object]]], iters: int,
                 warmup: int = 3) -> dict[str, float | str]:
    """Median seconds per system, together in rotating rounds; if that fails, each alone, so
    one failing system only loses its own number (an error string)."""
    if not named:
        return {}
    try:
        medians = medians_in_rounds([fn for _, fn in named], iters, ROUNDS, warmup)
        return {name: t for (name, _), t in zip(named, medians)}
    except Exception:
        traceback.print_exc()
    out: dict[str, float | str] = {}
    for name, fn in named:
        try:
            out[name] = medians_in_rounds([fn], iters, ROUNDS, warmup)[0]
        except Exception as exc:
            out[name] = describe(exc)
    return out


def store(row: Row, times: dict[str, float | str], attrs: dict[str, str]) -> None:
    """Put each system's median into its Row attribute, or its error into the notes."""
    for system, value in times.items():
        if isinstance(value, str):
            row.notes.append(f"{system} timing failed: {value}")
        else:
            setattr(row, attrs[system], value)


# ---- phase 1: full size -----------------------------------------------------------------------

def warm_fusecut(case: Case, clock: Clock) -> None:
    fd, row = case.fusecut, case.row
    start = time.perf_counter()
    try:
        fd.execute(case.inputs)
        torch.cuda.synchronize()
        case.fusecut_ok = True
        clock.log(f"  fusecut first call (plan + compile) {time.perf_counter() - start:.1f} s")
    except Exception as exc:
        row.notes.append(f"fusecut failed: {describe(exc)}")
        clock.log(f"  fusecut failed: {describe(exc)}")
    try:
        plan = fd.plan(case.inputs)  # the plan execute cached
        row.segments = len(plan.segments)
        row.lower_bound_bytes = logical_lower_bound(plan.plan)
    except Exception as exc:
        row.notes.append(f"fusecut plan failed: {describe(exc)}")


def warm_torch(case: Case, opts: Options, clock: Clock
               ) -> list[tuple[str, Callable[[], object]]]:
    """Eager and (unless disabled) torch.compile calls that ran once."""
    out = []
    args = case.inputs
    try:
        eager = eager_function(case.name, case.parsed.fusion, args)
        synced(lambda: eager(*args))()
        out.append(("eager", lambda: eager(*args)))
    except Exception as exc:
        case.row.notes.append(f"eager failed: {describe(exc)}")
        return out
    if opts.compile and case.name in COMPILE_SKIP:
        case.row.notes.append(f"torch.compile not run: {COMPILE_SKIP[case.name]}")
    elif opts.compile:
        start = time.perf_counter()
        try:
            compiled = torch.compile(eager)
            synced(lambda: compiled(*args))()
            out.insert(0, ("torch.compile", lambda: compiled(*args)))
            clock.log(f"  torch.compile warm-up {time.perf_counter() - start:.1f} s")
        except Exception as exc:
            case.row.notes.append(f"torch.compile failed: {describe(exc)}")
    return out


def measure_full(case: Case, peer: Peer, opts: Options, clock: Clock, bandwidth: float) -> None:
    row = case.row
    warm_fusecut(case, clock)
    if row.lower_bound_bytes is not None:
        row.floor_s = row.lower_bound_bytes / bandwidth
    named = [("fusecut", lambda: case.fusecut.execute(case.inputs))] if case.fusecut_ok else []
    if case.nvfuser is not None and peer.usable():
        why = start_nvfuser(case, case.inputs, peer, opts, clock, "full size")
        case.nvfuser_ok = not why
        if why:
            row.notes.append(f"nvFuser failed: {why}")
        else:
            named.append(("nvFuser", lambda: case.nvfuser.execute(case.inputs)))
    named += warm_torch(case, opts, clock)
    times = time_systems(named, opts.iters)
    store(row, times, {"fusecut": "fusecut_e2e", "nvFuser": "nvfuser_e2e",
                       "torch.compile": "compile_s", "eager": "eager_s"})
    row.notes += peer.background_note()
    clock.log("  e2e us: " + ", ".join(f"{k} {v * 1e6:.0f}" if isinstance(v, float) else
                                       f"{k} failed" for k, v in times.items()))


def run_full(names: list[str], peer: Peer, opts: Options, clock: Clock,
             bandwidth: float) -> tuple[list[Row], dict[str, Case]]:
    rows, cases = [], {}
    for name in names:
        if clock.past(FULL_SHARE):
            rows.append(Row(name, memory_bound=name not in NOT_MEMORY_BOUND,
                            notes=[OUT_OF_BUDGET]))
            continue
        clock.log(f"{name}: full size")
        try:
            case = prepare(name, peer, opts)
            cases[name] = case
            rows.append(case.row)
            measure_full(case, peer, opts, clock, bandwidth)
        except Exception as exc:  # one broken case never aborts the table
            traceback.print_exc()
            if name in cases:
                cases[name].row.notes.append(f"benchmark error: {describe(exc)}")
            else:
                rows.append(Row(name, memory_bound=name not in NOT_MEMORY_BOUND,
                                notes=[f"benchmark error: {describe(exc)}"]))
        torch.cuda.empty_cache()
    return rows, cases


# ---- phase 2: tiny inputs ---------------------------------------------------------------------

def measure_tiny(case: Case, peer: Peer, opts: Options, clock: Clock) -> TinyRow:
    metas = [shrink_meta(m) for m in case.parsed.inputs]
    row = TinyRow(case.name, shapes_text(metas))
    torch.manual_seed(0)
    tiny = [make_input(m, "cuda") for m in metas]
    named = []
    try:
        synced(lambda: case.fusecut.execute(tiny))()
        row.segments = len(case.fusecut.plan(tiny).segments)
        named.append(("fusecut", lambda: case.fusecut.execute(tiny)))
    except Exception as exc:
        row.notes.append(f"fusecut rejects the tiny inputs: {describe(exc)}")
    if case.nvfuser is not None and peer.usable():
        why = start_nvfuser(case, tiny, peer, opts, clock, "tiny")
        if why:
            row.notes.append(f"nvFuser rejects the tiny inputs: {why}")
        else:
            named.append(("nvFuser", lambda: case.nvfuser.execute(tiny)))
    elif peer.stuck:
        row.notes.append(f"nvFuser not run (stopped after {peer.stuck})")
    elif peer.nvfuser is not None:
        row.notes += [n for n in case.row.notes if n.startswith("nvFuser")] or ["nvFuser not run"]
    times = time_systems(named, opts.tiny_iters, warmup=10)
    store(row, times, {"fusecut": "fusecut_s", "nvFuser": "nvfuser_s"})
    row.notes += peer.background_note()
    clock.log("  tiny us/call: " + (", ".join(f"{k} {v * 1e6:.1f}" if isinstance(v, float)
                                              else f"{k} failed" for k, v in times.items())
                                    or "nothing ran"))
    return row


def run_tiny(names: list[str], cases: dict[str, Case], peer: Peer, opts: Options,
             clock: Clock) -> list[TinyRow]:
    rows = []
    for name in names:
        if clock.past(TINY_SHARE):
            rows.append(TinyRow(name, notes=[OUT_OF_BUDGET]))
            continue
        clock.log(f"{name}: tiny inputs")
        try:
            case = cases.get(name) or prepare(name, peer, opts, full_inputs=False)
            rows.append(measure_tiny(case, peer, opts, clock))
        except Exception as exc:
            traceback.print_exc()
            rows.append(TinyRow(name, notes=[f"benchmark error: {describe(exc)}"]))
    return rows


# ---- phase 3: kernels alone -------------------------------------------------------------------

def run_kernels(cases: dict[str, Case], peer: Peer, opts: Options, clock: Clock) -> str:
    """Fill the kernel columns of every case that ran; '' or why it could not."""
    jobs = []
    for case in cases.values():
        if case.fusecut_ok:
            jobs.append((f"{case.name}/fusecut", partial(case.fusecut.execute, case.inputs)))
        if case.nvfuser_ok and peer.usable():
            jobs.append((f"{case.name}/nvFuser", partial(case.nvfuser.execute, case.inputs)))
    if not jobs:
        return ""
    clock.log(f"kernels alone: {len(jobs)} systems x {opts.profile_calls} profiled calls")
    try:
        stats = profile_calls(jobs, opts.profile_calls, log=clock.log)
    except Exception as exc:
        traceback.print_exc()
        return f"kernel times unavailable: the profiler failed ({describe(exc)})"
    for case in cases.values():
        for system, time_attr, count_attr in (("fusecut", "fusecut_kernels", "fusecut_launches"),
                                              ("nvFuser", "nvfuser_kernels", "nvfuser_launches")):
            s = stats.get(f"{case.name}/{system}")
            if s is None:
                continue
            setattr(case.row, time_attr, s.device_s)
            setattr(case.row, count_attr, s.kernels if math.isfinite(s.device_s) else None)
            extra = [f"{n} {what}/call" for n, what in ((s.memsets, "memset"),
                                                        (s.memcpys, "memcpy")) if n]
            case.row.notes += [f"{system} kernels: {note}" for note in extra + s.notes]
    return ""


# ---- the run ----------------------------------------------------------------------------------

def method_notes(systems: Systems, peer: Peer, opts: Options, full: float | None,
                 problems: list[str]) -> str:
    """The notes under the tables; ``full`` is the copy bandwidth of a full-size run (None in a
    tiny-only run)."""
    lines = [
        f"Same process, same input tensors for every system, each called once before timing "
        f"(planning and compilation excluded); PyTorch {torch.__version__}"
        + (f", nvfuser_direct {peer.nvfuser.version}" if peer.nvfuser else "") + ".",
        f"Time per call: CUDA events around one call (record, call, record, synchronize), "
        f"median of {opts.tiny_iters if full is None else opts.iters} warm calls per system "
        f"in {ROUNDS} rounds of rotating order"
        + (f"; tiny inputs: median of {opts.tiny_iters}." if full is not None else "."),
    ]
    if full is not None:
        lines.append(f"Kernels: the torch.profiler sum of the device activity of one call "
                     f"(kernels, plus memsets/memcpys the call launched: the note counts them), "
                     f"median of {opts.profile_calls} calls, profiled after all the timing; "
                     f"'kernels/call' counts kernel launches, 'segments' is fusecut's plan.")
    if systems.nvfuser:
        lines.append("Ratios are nvFuser time / fusecut time: above 1 means fusecut is faster. "
                     "Geometric means cover the memory-bound cases (mlp_gelu is not) where "
                     "nvFuser ran.")
    if full:
        lines.append(f"Floor = logical lower-bound bytes (inputs read once, outputs written "
                     f"once) / copy bandwidth measured here, {full / 1e9:.0f} GB/s.")
    if full is not None:
        lines.append("Eager runs tests/corpus_torch.py (the torch reference interpreter for the "
                     "generated cases); torch.compile compiles the same function."
                     if systems.compile else "torch.compile: not run (--no-compile).")
    if not systems.nvfuser:
        lines.append(f"nvFuser columns left out: {peer.reason}.")
    if peer.stuck:
        lines.append(f"nvFuser stopped after a first call ran past {opts.nvfuser_first_call_s:.0f}"
                     f" s: {peer.stuck}.")
    lines += problems
    return "\n".join(f"- {line}" for line in lines)


def save(rows: list[Row], tiny: list[TinyRow], systems: Systems, notes: str, clock: Clock) -> None:
    path = write_result("e2e", torch.cuda.get_device_name(), TITLE, render(rows, tiny, systems),
                        notes)
    clock.log(f"tables written to {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help="comma-separated corpus case names "
                        "(default: all, the heaviest last)")
    parser.add_argument("--iters", type=int, default=50, help="timed full-size calls per system")
    parser.add_argument("--tiny-iters", type=int, default=200, help="timed tiny-input calls")
    parser.add_argument("--profile-calls", type=int, default=5,
                        help="profiled calls per system for the kernel times")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--no-nvfuser", action="store_true", help="leave nvFuser out")
    parser.add_argument("--tiny-only", action="store_true", help="only the tiny-input table")
    parser.add_argument("--budget-s", type=float, default=400.0,
                        help="wall-clock budget of the run: no new full-size case after 65%% of "
                        "it, no new tiny case after 85%%")
    parser.add_argument("--nvfuser-skip", default=",".join(NVFUSER_SKIP),
                        help="cases nvFuser does not run (its first call took minutes); "
                        "'' runs all")
    parser.add_argument("--nvfuser-first-call-s", type=float, default=90.0,
                        help="how long to wait for one nvFuser first call (it compiles)")
    args = parser.parse_args(argv)
    known = corpus_names()
    args.case_list = [c for c in args.cases.split(",") if c] or known
    unknown = sorted(set(args.case_list) - set(known))
    if unknown:
        parser.error(f"unknown cases {unknown}; the corpus has: {', '.join(known)}")
    for flag in ("iters", "tiny_iters", "profile_calls"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.e2e times GPU execution and needs a CUDA GPU; none is "
                         "visible here (try --help)")
    clock = Clock(args.budget_s)
    opts = Options(iters=args.iters, tiny_iters=args.tiny_iters,
                   profile_calls=args.profile_calls,
                   compile=not (args.no_compile or args.tiny_only),
                   nvfuser_skip=tuple(c for c in args.nvfuser_skip.split(",") if c),
                   nvfuser_first_call_s=args.nvfuser_first_call_s)
    if args.no_nvfuser:
        peer = Peer(None, "not asked for (--no-nvfuser)")
    else:
        peer = Peer(*load_nvfuser())
    systems = Systems(nvfuser=peer.nvfuser is not None, compile=opts.compile)
    from fusecut.runtime import launcher

    launcher.native(wait=True)  # warm calls are timed on the path users get once it is built
    clock.log(f"{torch.cuda.get_device_name()}; nvFuser: "
              f"{peer.nvfuser.version if peer.nvfuser else peer.reason}; native launcher: "
              f"{'built' if launcher.native() else launcher.failure()}")
    rows: list[Row] = []
    cases: dict[str, Case] = {}
    bandwidth = None
    problems: list[str] = []
    if not args.tiny_only:
        bandwidth = copy_bandwidth()
        clock.log(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
        rows, cases = run_full(args.case_list, peer, opts, clock, bandwidth)
        save(rows, [], systems, method_notes(systems, peer, opts, bandwidth, problems), clock)
    tiny = run_tiny(args.case_list, cases, peer, opts, clock)
    save(rows, tiny, systems, method_notes(systems, peer, opts, bandwidth, problems), clock)
    if cases:
        why = run_kernels(cases, peer, opts, clock)
        if why:
            problems.append(why)
    cases.clear()
    notes = method_notes(systems, peer, opts, bandwidth, problems)
    print(render(rows, tiny, systems))
    print(notes)
    save(rows, tiny, systems, notes, clock)
    if peer.straggler is not None and peer.straggler.is_alive():
        clock.log("an nvFuser first call is still running; leaving without waiting for it")
        sys.stdout.flush()
        os._exit(0)  # interpreter shutdown could wait on (or crash in) the compiling thread


if __name__ == "__main__":
    main()
