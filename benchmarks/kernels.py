"""Kernel benchmark (GPU): each corpus case end to end, fusecut against PyTorch eager and
torch.compile (Inductor) in the same process, and against the floor.

The floor is the lower-bound bytes (every input read once, every output written once at its
logical size, as the corpus README counts it) over the copy bandwidth measured here. Times are
CUDA-event medians of warm runs. Prints the table and writes it to benchmarks/results/.

    python -m benchmarks.kernels [--cases a,b] [--iters 20] [--no-compile]

benchmarks.e2e goes further: fusecut's public fd.execute and its kernels alone against the real
nvFuser, and host latency on tiny inputs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import traceback

import torch

from benchmarks.common import CORPUS, markdown_table, write_result
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.kernels import cuda_runner
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import make_input

NOT_MEMORY_BOUND = {"mlp_gelu"}  # matrix products dominate


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / median_time(lambda: dst.copy_(src), iters=20)


def median_time(fn, iters: int = 20, warmup: int = 3) -> float:
    return medians_in_rounds([fn], iters, rounds=1, warmup=warmup)[0]


def medians_in_rounds(fns, iters: int, rounds: int = 5, warmup: int = 3) -> list[float]:
    """Median CUDA-event time of each function (``times_in_rounds``)."""
    return [statistics.median(spent) for spent in times_in_rounds(fns, iters, rounds, warmup)]


def times_in_rounds(fns, iters: int, rounds: int = 5, warmup: int = 3) -> list[list[float]]:
    """CUDA-event times of each function over ``iters`` warm runs, taken in ``rounds`` blocks
    whose order rotates (a b c, b c a, c a b...): clock and thermal drift during the measurement
    falls on every candidate alike, and each block starts warm."""
    times: list[list[float]] = [[] for _ in fns]
    per_round = max(1, iters // rounds)
    for r in range(rounds):
        order = list(range(len(fns)))
        order = order[r % len(order):] + order[:r % len(order)]
        for k in order:
            for _ in range(warmup):
                fns[k]()
            torch.cuda.synchronize()
            for _ in range(per_round):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fns[k]()
                end.record()
                end.synchronize()
                times[k].append(start.elapsed_time(end) / 1e3)
    return times


def logical_lower_bound(plan) -> int:
    """Inputs read once (compact, as their strides store them), outputs written in full."""
    bound = plan.bound
    fusion = plan.fusion
    reads = plan.lower_bound_bytes - sum(bound.nbytes(t) for t in dict.fromkeys(fusion.outputs)
                                         if t not in fusion.inputs)
    writes = sum(bound.numel(t) * fusion.tensors[t].dtype.itemsize
                 for t in dict.fromkeys(fusion.outputs) if t not in fusion.inputs)
    return reads + writes


def eager_function(name: str, fusion, args):
    from tests.corpus_torch import CASES

    if name in CASES:
        return CASES[name]
    return lambda *a: run_reference(fusion, list(a))


def measure(name: str, iters: int, compile_peers: bool):
    """(plan, fusecut seconds, eager seconds, torch.compile seconds) of one corpus case."""
    parsed = parse_text((CORPUS / f"{name}.py").read_text())
    torch.manual_seed(0)
    args = [make_input(m, "cuda") for m in parsed.inputs]
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions())
    eager = eager_function(name, parsed.fusion, args)
    calls = [lambda: execute_plan(plan, args, cuda_runner, "cuda"), lambda: eager(*args)]
    if compile_peers:
        try:
            compiled = torch.compile(eager)
            start = time.perf_counter()
            compiled(*args)
            torch.cuda.synchronize()
            print(f"  {name}: torch.compile warm-up {time.perf_counter() - start:.1f} s",
                  flush=True)
            calls.append(lambda: compiled(*args))
        except Exception:
            traceback.print_exc()
    medians = medians_in_rounds(calls, iters)
    t_fc, t_eager = medians[0], medians[1]
    t_comp = medians[2] if len(medians) > 2 else math.nan
    return plan, t_fc, t_eager, t_comp


def run(cases: list[str], iters: int, compile_peers: bool) -> tuple[str, str, str]:
    bw = copy_bandwidth()
    device = torch.cuda.get_device_name()
    print(f"{device}: copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    rows, fractions = [], {"fusecut": [], "eager": [], "compile": []}
    wins = 0
    for name in cases:
        plan, t_fc, t_eager, t_comp = measure(name, iters, compile_peers)
        floor = logical_lower_bound(plan) / bw
        memory_bound = name not in NOT_MEMORY_BOUND
        if memory_bound:
            fractions["fusecut"].append(floor / t_fc)
            fractions["eager"].append(floor / t_eager)
            if not math.isnan(t_comp):
                fractions["compile"].append(floor / t_comp)
                wins += t_fc < t_comp
        rows.append([name, f"{logical_lower_bound(plan) / 2**20:.0f}", f"{floor * 1e6:.0f}",
                     str(len(plan.segments)), f"{t_fc * 1e6:.0f}", f"{t_eager * 1e6:.0f}",
                     f"{t_comp * 1e6:.0f}", f"{floor / t_fc:.2f}", f"{floor / t_eager:.2f}",
                     f"{floor / t_comp:.2f}", f"{t_comp / t_fc:.2f}x",
                     "" if memory_bound else "not memory-bound"])
        print(" | ".join(rows[-1]), flush=True)
        torch.cuda.empty_cache()

    def geo(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan

    n_mb = len(fractions["fusecut"])
    rows.append(["geometric mean (memory-bound)", "", "", "", "", "", "",
                 f"{geo(fractions['fusecut']):.2f}", f"{geo(fractions['eager']):.2f}",
                 f"{geo(fractions['compile']):.2f}", "", f"faster than torch.compile on "
                 f"{wins}/{n_mb}"])
    headers = ["case", "lower bound MiB", "floor us", "segments", "fusecut us", "eager us",
               "compile us", "fusecut / floor", "eager / floor", "compile / floor",
               "speedup vs compile", "note"]
    table = markdown_table(headers, rows)
    notes = (f"Copy bandwidth measured in the same process: {bw / 1e9:.0f} GB/s (bytes read + "
             f"written). Floor = lower-bound bytes / copy bandwidth; 'x / floor' = floor time / "
             f"measured time (1.0 is the floor). Median of {iters} warm runs per candidate, in 5 "
             f"rounds of rotating order (drift falls on all alike); CUDA events, same process, "
             f"PyTorch {torch.__version__}. Eager runs the hand-written torch code of "
             f"tests/corpus_torch.py (the torch reference interpreter for the generated cases); "
             f"torch.compile compiles the same function.")
    return device, table + "\n", notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default="")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    cases = args.cases.split(",") if args.cases else sorted(p.stem for p in CORPUS.glob("*.py"))
    device, table, notes = run(cases, args.iters, not args.no_compile)
    print(table)
    print(notes)
    print(f"written to {write_result('kernels', device, 'Kernel benchmark', table, notes)}")


if __name__ == "__main__":
    main()
