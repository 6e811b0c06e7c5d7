"""The GPU differential fuzzer: random fusions (``benchmarks.fuzz_fusions``) run through
fusecut's generated kernels on the GPU and through the torch reference on the same arguments.

    python -m benchmarks.gpu_fuzz [--cases 10000] [--fresh 2000] [--workers 14] [--out DIR]

``--cases`` fixed seeds (0, 1, ...) and ``--fresh`` seeds drawn from the clock (printed, so a
failure reproduces). Each case is planned, compiled and run the way ``fd.execute`` runs it (the
compiled program, its warm call); every output is compared with the reference. Odd seeds run
the plan ``fd.execute`` picks (its range's plan rebound to the case's extents), even ones the
search for exactly them. A mismatch is
then narrowed to its segment (that segment alone on the GPU, every other on the reference), and
a repro file is written: the whole case in nvFuser's repro format, and the failing segment as a
definition of its own with its arguments' metadata. A case that raises (plan, codegen, NVRTC,
launch) counts as an error with its message; one that kills its process, as a crash. The
table goes to ``benchmarks/results/``; the exit status is 1 when any case did not match.

Without a GPU, ``--cpu`` plans and generates every case and runs its plan segment by segment
on the reference (no kernel runs): the planner's and the generator's check.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from benchmarks.common import RunResults, markdown_table
from benchmarks.fuzz_fusions import case

# A float output matches within a few roundings of its scale (reductions sum in another order).
TOLERANCE = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-4}


@dataclass
class Outcome:
    seed: int
    family: str
    status: str  # "ok", "mismatch", "error" (it raised) or "crash" (its process died)
    detail: str = ""
    kinds: list[str] = field(default_factory=list)
    repro: str = ""


def mismatch(got, want) -> str:
    """Why ``got`` is not ``want`` (outputs in order), or "" when every output matches."""
    import torch

    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for k, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {a.dtype}{list(a.shape)}, expected {b.dtype}{list(b.shape)}"
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return f"output {k}: {int((a != b).sum())} of {a.numel()} elements differ"
            continue
        tol = TOLERANCE.get(str(a.dtype).removeprefix("torch."), 1e-9)
        a, b = a.double(), b.double()
        finite = b[torch.isfinite(b)]
        scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
        both_nan = torch.isnan(a) & torch.isnan(b)
        same_inf = torch.isinf(b) & (a == b)
        off = (a - b).abs().masked_fill(both_nan | same_inf, 0.0).nan_to_num(float("inf"))
        bad = off > tol * scale + tol * b.abs().nan_to_num(0.0)
        if bool(bad.any()):
            at = tuple(int(i) for i in bad.nonzero()[0])
            return (f"output {k}: {int(bad.sum())} of {a.numel()} elements off, largest "
                    f"{float(off.max()):.3g} at scale {scale:.3g}; first at {list(at)}: "
                    f"{float(a[at]):.6g} against {float(b[at]):.6g}")
    return ""


def run_case(seed: int, device: str) -> Outcome:
    """One case on ``device`` ("cuda", or "cpu": plan, generate, and run each segment on the
    reference). Odd seeds run the plan ``fd.execute`` picks (its range's plan, rebound to these
    extents: ``optimizer.plan.rebind``), even ones the search for exactly these inputs."""
    import torch

    from fusecut.codegen import generate_segment
    from fusecut.engine import Engine
    from fusecut.optimizer.planner import PlanOptions, make_plan
    from fusecut.runtime.kernels import NOT_GENERATED
    from fusecut.runtime.reference import run_reference
    from fusecut.runtime.run import run_plan
    from fusecut.runtime.tensors import make_input

    c = case(seed)
    out = Outcome(seed, c.family, "ok")
    try:
        if seed % 2:
            plan = Engine().fusion(c.fusion).execution_plan(c.inputs, time_limit_s=1.0)
        else:
            plan = make_plan(c.fusion, c.inputs, PlanOptions(time_limit_s=1.0))
        out.kinds = [s.kind.value for s in plan.segments]
        if device == "cpu":
            for s in plan.segments:
                if s.kind not in NOT_GENERATED:
                    generate_segment(plan, s)
            args = [make_input(m, device, torch.Generator().manual_seed(seed))
                    for m in c.inputs]
            why = mismatch(run_plan(plan, args).outputs, run_reference(c.fusion, args))
            if why:  # the plan's segments, each on the reference, are not the fusion
                out.status, out.detail = "mismatch", why
            return out
        gen = torch.Generator(device=device).manual_seed(seed)
        args = [make_input(m, device, gen) for m in c.inputs]
        got = run_plan(plan, args).outputs
        want = run_reference(c.fusion, args)
        why = mismatch(got, want)
    except Exception as e:  # a case that raises is a finding too
        out.status, out.detail = "error", f"{type(e).__name__}: {_first(e)}"
        out.repro = _repro(c, "", traceback.format_exc())
        return out
    if why:
        out.status, out.detail = "mismatch", why
        out.repro = _repro(c, why, _narrow(plan, args, want))
    return out


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _narrow(plan, args, want) -> str:
    """The segments that are wrong alone (run on the GPU, every other on the reference), each
    as a definition of its own with its arguments' metadata."""
    from fusecut.engine import as_metadata
    from fusecut.optimizer.ir.printer import print_fusion
    from fusecut.runtime.executor import execute_plan, reference_runner
    from fusecut.runtime.kernels import NOT_GENERATED, cuda_runner

    found = []
    for s in plan.segments:
        if s.kind in NOT_GENERATED:
            continue
        seen: dict[int, list] = {}

        def runner(p, seg, a, scalars, k=s.index, seen=seen):
            if seg.index != k:
                return reference_runner(p, seg, a, scalars)
            seen[k] = list(a)
            return cuda_runner(p, seg, a, scalars)

        try:
            why = mismatch(execute_plan(plan, args, runner, "cuda").outputs, want)
        except Exception as e:
            why = f"{type(e).__name__}: {_first(e)}"
        if why:
            metas = as_metadata(seen.get(s.index, []))
            found.append(f"# segment {s.index} ({s.kind.value}) alone: {why}\n"
                         + print_fusion(s.sub.fusion, f"segment{s.index}", metas or None))
    return "\n".join(found) or "# no segment is wrong alone: the plan's hand-over is"


def _repro(c, why: str, narrowed: str) -> str:
    from fusecut.optimizer.ir.printer import print_fusion

    return (f"# gpu_fuzz {c.label}: {why}\n# reproduce: python -m benchmarks.gpu_fuzz --seed "
            f"{c.seed}\n" + print_fusion(c.fusion, inputs=c.inputs) + "\n" + narrowed + "\n")


def run_chunk(seeds: list[int], device: str, progress: str | None = None) -> list[Outcome]:
    """The outcomes of ``seeds``; each seed is written to ``progress``/PID before it runs, so
    that the seed a crashed process was running is known."""
    done = []
    for seed in seeds:
        if progress:
            Path(progress, str(os.getpid())).write_text(str(seed))
        done.append(run_case(seed, device))
    if progress:
        Path(progress, str(os.getpid())).unlink(missing_ok=True)
    return done


def run(seeds: list[int], device: str, workers: int, on_result=None) -> list[Outcome]:
    """Every seed's outcome, in chunks over ``workers`` processes (NVRTC compiles on the host:
    many processes keep one GPU busy). ``on_result`` sees each chunk's outcomes as they come.
    A case that kills its process (a crash in a kernel or the driver) breaks the pool: the seeds
    then in flight are run again one process each, and the one that dies alone is a "crash";
    the other chunks go on in a new pool."""
    import tempfile

    outcomes: list[Outcome] = []

    def take(done: list[Outcome]) -> None:
        outcomes.extend(done)
        if on_result:
            on_result(done, len(outcomes))

    if workers <= 1:
        for i in range(0, len(seeds), 25):
            take(run_chunk(seeds[i:i + 25], device))
        return outcomes
    pending = [seeds[i:i + 25] for i in range(0, len(seeds), 25)]
    while pending:
        with tempfile.TemporaryDirectory() as progress:
            broken, left = _pool(pending, device, workers, progress, take)
            suspects = [int(p.read_text()) for p in Path(progress).iterdir() if p.read_text()]
        pending = [[s for s in chunk if s not in suspects] for chunk in left]
        pending = [c for c in pending if c]
        for seed in suspects if broken else ():
            take([_alone(seed, device)])
    return sorted(outcomes, key=lambda o: o.seed)


def _pool(chunks, device, workers, progress, take) -> tuple[bool, list[list[int]]]:
    """Run ``chunks`` in one pool: (whether it broke, the chunks it did not finish)."""
    from concurrent.futures.process import BrokenProcessPool

    left = {i: chunk for i, chunk in enumerate(chunks)}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_chunk, chunk, device, progress): i
                   for i, chunk in left.items()}
        try:
            for done in as_completed(futures):
                take(done.result())
                del left[futures[done]]
        except BrokenProcessPool:
            return True, list(left.values())
    return False, []


def _alone(seed: int, device: str) -> Outcome:
    """``seed`` in a process of its own: its outcome, or a crash when the process dies."""
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        try:
            return pool.submit(run_case, seed, device).result()
        except BrokenProcessPool:
            c = case(seed)
            return Outcome(seed, c.family, "crash", "the process running it died",
                           repro=_repro(c, "the process running it died", ""))


def summary(outcomes: list[Outcome]) -> str:
    rows = []
    by_family = collections.defaultdict(list)
    for o in outcomes:
        by_family[o.family].append(o)
    for family in sorted(by_family) + ["all"]:
        group = outcomes if family == "all" else by_family[family]
        count = collections.Counter(o.status for o in group)
        segments = collections.Counter(k for o in group for k in o.kinds)
        rows.append([family, len(group), count["ok"], count["mismatch"], count["error"],
                     count["crash"], ", ".join(f"{k} {n}" for k, n in sorted(segments.items()))])
    return markdown_table(["family", "cases", "match", "mismatch", "error", "crash",
                           "segments run"], rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10000, help="fixed seeds 0..N-1")
    ap.add_argument("--fresh", type=int, default=0, help="more seeds drawn from the clock")
    ap.add_argument("--seed", type=int, action="append", help="run only these seeds")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--cpu", action="store_true",
                    help="plan, generate and run the segments on the reference (no GPU)")
    ap.add_argument("--out", type=Path, default=None, help="folder for repro files")
    ap.add_argument("--no-results", action="store_true", help="write no results file")
    a = ap.parse_args(argv)
    import torch

    device = "cpu" if a.cpu or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not a.cpu:
        print("no GPU: planning, generating and running on the reference only (--cpu)",
              file=sys.stderr)
    base = int(time.time()) % 1_000_000 * 1000 + 10_000_000
    fresh = list(range(base, base + a.fresh))
    seeds = a.seed or (list(range(a.cases)) + fresh)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    results = None if a.no_results else RunResults("gpu-fuzz", name,
                                                   "GPU differential fuzzer (benchmarks.gpu_fuzz)")
    out_dir = a.out
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    print(f"{len(seeds)} cases on {name} ({a.cases} fixed seeds from 0"
          + (f", {a.fresh} fresh from {base}" if fresh else "") + f"), {a.workers} workers",
          flush=True)

    def report(done: list[Outcome], total: int) -> None:  # as they come: a timeout loses none
        for o in done:
            if o.status != "ok":
                print(f"{o.status}: seed {o.seed} ({o.family}; {' '.join(o.kinds)}): {o.detail}",
                      flush=True)
                if out_dir:
                    (out_dir / f"repro-seed{o.seed}.py").write_text(o.repro)
        if total % 1000 < len(done):
            print(f"{total} of {len(seeds)} cases, {time.monotonic() - start:.0f} s", flush=True)

    outcomes = run(seeds, device, a.workers, report)
    bad = [o for o in outcomes if o.status != "ok"]
    table = summary(outcomes)
    print(table)
    seconds = time.monotonic() - start
    notes = (f"{len(outcomes)} cases ({a.cases} fixed seeds from 0"
             + (f", {a.fresh} fresh from seed {base}" if fresh else "")
             + f") in {seconds:.0f} s; {len(bad)} mismatched or failed.\n\n"
             + "\n".join(f"- {o.status}: seed {o.seed} ({o.family}): {o.detail}"
                         for o in bad[:50]))
    if results is not None and not a.seed:
        print(f"wrote {results.write(table, notes)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
