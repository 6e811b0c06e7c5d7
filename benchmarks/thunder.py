"""Thunder benchmark (GPU): fusecut inside Thunder against Thunder's own default executors.

Blocks (``benchmarks.models``): Thunder's nanoGPT ``Block`` and llama2 ``TransformerBlock``, a
Llama-3-style block, and nanoGPT with dropout 0.1; bf16. Steps: a training step (forward and
backward with a fixed output gradient, batch 8, sequence 2048, width 2048) and a batch-1
inference step (forward only under ``torch.no_grad``, sequence 128: host-bound). Systems, in one
process on the same weights and inputs:

- ``thunder default``: ``thunder.jit(m)``, Thunder's default executors (sdpa, the torch.compile
  cross-entropy executor, nvFuser);
- ``thunder default, fusecut``: the same list with ``fusecut_ex`` in nvFuser's place;
- the same with fusecut's GEMM epilogues off (``FusecutExecutor(gemm_epilogues=False)``): the
  tanh GELU and its derivative back in fusecut's regions instead of the matmuls;
- ``thunder fusecut only``: ``thunder.jit(m, executors=[fusecut_ex])``;
- ``torch.compile`` and eager.

Per row: ms per step (median of warm steps, CUDA events, timed in rounds of rotating order
across the systems), its ratio to Thunder's default with a 95% bootstrap interval
(``benchmarks.intervals``: a ratio whose interval straddles a goal has not shown it), GPU busy
ms per step and GPU ops per step (kernels, copies and memsets, from torch.profiler over a few
steps), and for fusecut the bytes its regions planned against their lower bound. A second
table lists each system's top kernels.

    python -m benchmarks.thunder [--steps train,infer] [--models nanogpt_block,...] [--iters 10]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.common import RunResults, markdown_table
from benchmarks.intervals import median_ratio_interval

STEPS = {"train": (8, 2048), "infer": (1, 128)}  # batch, sequence
ROW_MARK = "ROW\t"  # a child's row on its stdout
HEADERS = ["model", "step", "system", "ms / step", "vs thunder default (95% interval)",
           "GPU busy ms", "GPU ops / step", "fusecut planned / lower bound MiB", "note"]


def systems() -> list[tuple[str, Callable]]:
    from fusecut.thunder.executor import fusecut_ex, thunder

    defaults = list(thunder.get_default_executors())
    names = [e.name for e in defaults]

    def in_nvfusers_place(executor) -> list:
        return ([executor if e.name == "nvfuser" else e for e in defaults]
                if "nvfuser" in names else defaults + [executor])

    with_fusecut = in_nvfusers_place(fusecut_ex)
    without_epilogues = in_nvfusers_place(plain_gemm_executor())
    return [
        (f"thunder default ({', '.join(names)})", lambda m: thunder.jit(m)),
        ("thunder default, fusecut for nvFuser", lambda m: thunder.jit(m, executors=with_fusecut)),
        ("thunder default, fusecut for nvFuser, GELU outside the GEMMs",
         lambda m: thunder.jit(m, executors=without_epilogues)),
        ("thunder fusecut only", lambda m: thunder.jit(m, executors=[fusecut_ex])),
        ("torch.compile", lambda m: torch.compile(m)),
        ("eager", lambda m: m),
    ]


_plain_gemms = []


def plain_gemm_executor():
    """fusecut_ex's twin with its GEMM epilogues off: what they are worth, in the same process."""
    from fusecut.thunder.executor import FusecutExecutor

    if not _plain_gemms:
        _plain_gemms.append(FusecutExecutor("fusecut_plain_gemms", gemm_epilogues=False))
    return _plain_gemms[0]


@dataclass
class Measured:
    ms: float
    busy_ms: float
    ops: float
    top: list[tuple[str, float, float]] = field(default_factory=list)  # name, ms/step, calls


def run_step(fn, x, extra, grad):
    if grad is None:
        with torch.no_grad():
            return fn(x, *extra)
    y = fn(x, *extra)
    y.backward(grad)
    return y


def profile_step(fn, x, extra, grad, profiled: int = 3,
                 timeline: str | None = None) -> tuple[float, float, list]:
    """GPU busy ms and GPU ops per step, and the top ops, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            run_step(fn, x, extra, grad)
        torch.cuda.synchronize()
    if timeline:  # the GPU ops of the last profiled step, in order: which region is which
        ops = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
        per_step = len(ops) // profiled
        last = ops[-per_step:]
        t0 = last[0].time_range.start if last else 0
        with open(timeline, "w") as f:  # start (ms into the step), duration, name: gaps show
            f.writelines(f"{(e.time_range.start - t0) / 1e3:8.3f} {e.device_time_total / 1e3:8.3f}"
                         f" ms  {e.name[:120]}\n" for e in last)
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    busy = sum(e.self_device_time_total for e in kernels) / 1e3 / profiled
    ops = sum(e.count for e in kernels) / profiled
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:6]
    return busy, ops, [(e.key[:90], e.self_device_time_total / 1e3 / profiled, e.count / profiled)
                       for e in top]


def fusecut_bytes(jitted) -> str:
    from fusecut.thunder.reports import region_reports

    reports = [r for r in region_reports(jitted) if r.planned_bytes is not None]
    planned = sum(r.planned_bytes for r in reports) / 2**20
    bound = sum(r.lower_bound_bytes for r in reports) / 2**20
    fallbacks = sum(1 for r in region_reports(jitted) if r.fallback)
    note = f"{len(reports)} regions" + (f", {fallbacks} on torch" if fallbacks else "")
    return f"{planned:.0f} / {bound:.0f} ({note})"


def dump_traces(fn, path: str) -> None:
    """The last forward (and backward) execution traces Thunder ran, for reading."""
    from fusecut.thunder.executor import thunder

    texts = [str(thunder.last_traces(fn)[-1])]
    try:
        texts.append(str(thunder.last_backward_traces(fn)[-1]))
    except Exception:  # an inference step has no backward
        pass
    with open(path, "w") as f:
        f.write("\n\n".join(texts))


def run_model(step: str, model: str, iters: int, width: int, emit,
              traces: str | None = None) -> None:
    """Every system on one block and step: ``emit(row, top)`` for each.

    All systems are built first, then timed in rounds whose order rotates
    (``times_in_rounds``): the GPU's clocks drift as it heats, and the system timed last
    would otherwise pay for it. Profiling comes after all timing."""
    from benchmarks.kernels import times_in_rounds
    from benchmarks.models import blocks, place

    batch, seq = STEPS[step]
    [(name, module, extra)] = [b for b in blocks(width, seq) if b[0] == model]
    torch.manual_seed(0)
    module, extra = place(module, extra, "cuda", torch.bfloat16)
    if step == "infer":
        module.eval()
    x = torch.randn(batch, seq, width, device="cuda", dtype=torch.bfloat16,
                    requires_grad=step == "train")
    grad = torch.randn_like(x) if step == "train" else None
    ready: list[tuple[str, Callable, float]] = []  # system, jitted step, first step s
    named = systems()
    for system, make in named:
        try:
            fn = make(copy.deepcopy(module))
            start = time.perf_counter()
            run_step(fn, x, extra, grad)
            torch.cuda.synchronize()
            ready.append((system, fn, time.perf_counter() - start))
        except Exception as e:  # one failing system never aborts the table
            traceback.print_exc()
            emit(failed_row(name, step, system, e), "")
    steps = [lambda fn=fn: run_step(fn, x, extra, grad) for _, fn, _ in ready]
    samples = times_in_rounds(steps, iters, rounds=len(ready)) if ready else []
    default = dict(zip((system for system, _, _ in ready), samples)).get(named[0][0])
    for (system, fn, first), seconds in zip(ready, samples):
        try:
            tag = re.sub(r"[^a-z]+", "-", system.lower())[:32].strip("-")
            busy, ops, top_ops = profile_step(fn, x, extra, grad, timeline=traces and
                                              f"{traces}/{name}-{step}-{tag}.kernels.txt")
            planned = fusecut_bytes(fn) if "fusecut" in system else "-"
            if traces and system.startswith("thunder"):
                dump_traces(fn, f"{traces}/{name}-{step}-{tag}.txt")
            row = [name, step, system, f"{statistics.median(seconds) * 1e3:.2f}",
                   against_default(seconds, default), f"{busy:.2f}", f"{ops:.0f}", planned,
                   f"first step {first:.1f} s"]
            top = "; ".join(f"{k} {ms:.3f} ms x{n:.0f}" for k, ms, n in top_ops)
        except Exception as e:
            traceback.print_exc()
            row, top = failed_row(name, step, system, e), ""
        emit(row, top)
    del ready, steps
    torch.cuda.empty_cache()


def against_default(seconds: list[float], default: list[float] | None) -> str:
    """This system's step time over Thunder's default one, with its bootstrap interval; "-" for
    the default itself, or where it did not run."""
    if default is None or seconds is default:
        return "-"
    return str(median_ratio_interval(seconds, default))


def failed_row(model: str, step: str, system: str, e: BaseException) -> list[str]:
    return [model, step, system] + ["-"] * (len(HEADERS) - 4) + [f"fails: {one_line(e)}"]


def one_line(e: BaseException | str) -> str:
    text = f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else e
    return text.replace("\n", " ").replace("|", "/")[:200]


def child_rows(lines, finish, model: str, step: str, system_names: list[str]):
    """(row, top kernels) of each system a child process reported, as they come; when the child
    ended badly (``finish()`` gives its exit code), one more row for the system it stopped in,
    with its last line of output. Systems after that one have no row: they did not run."""
    done, last = set(), "no output"
    for line in lines:
        if line.startswith(ROW_MARK):
            row, top = json.loads(line[len(ROW_MARK):])
            done.add(row[2])
            yield row, top
        elif line.strip():
            last = line.strip()
    code = finish()
    if code != 0:
        stopped_in = next((s for s in system_names if s not in done), None)
        if stopped_in is not None:
            yield [model, step, stopped_in] + ["-"] * (len(HEADERS) - 4) + [
                f"not run: the process stopped ({one_line(last)})"], ""


def run(steps: list[str], models: list[str], iters: int, width: int, log,
        traces: str | None = None, on_row=None) -> tuple[str, str]:
    """Each (step, block) in a process of its own, so that a CUDA error, which poisons the
    process's context, costs only the systems after it on that block (marked as such)."""
    rows, tops = [], []
    system_names = [name for name, _ in systems()]
    for step in steps:
        for model in models:
            command = [sys.executable, "-m", "benchmarks.thunder", "--child", "--steps", step,
                       "--models", model, "--iters", str(iters), "--width", str(width)]
            if traces:
                command += ["--traces", traces]
            # stderr joins stdout: two pipes read one after the other can fill and block.
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
            for row, top in child_rows(child.stdout, child.wait, model, step, system_names):
                rows.append(row)
                tops.append(row[:3] + [top])
                log(" | ".join(row))
                if on_row is not None:  # the table so far, so that a crash loses nothing
                    on_row(markdown_table(HEADERS, rows))
    notes = (f"Training step: batch {STEPS['train'][0]}, sequence {STEPS['train'][1]}; inference "
             f"step: batch {STEPS['infer'][0]}, sequence {STEPS['infer'][1]}, forward under "
             f"no_grad; width {width}, bf16, 128-wide heads. Median of {iters} warm steps (CUDA "
             f"events), timed in rounds whose order rotates across the systems; the ratio to "
             f"Thunder's default with the middle 95% of 2000 bootstrap resamples of both "
             f"systems' steps; GPU busy time "
             f"and op counts from torch.profiler over 3 steps. Each block and step runs in a "
             f"process of its own. PyTorch {torch.__version__}.")
    top_table = markdown_table(["model", "step", "system", "top GPU ops (ms / step, calls)"],
                               tops)
    return markdown_table(HEADERS, rows) + "\n\n## Top GPU ops per system\n\n" + top_table, notes


def main() -> None:
    from benchmarks.models import MODEL_NAMES

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="train,infer")
    parser.add_argument("--models", default=",".join(MODEL_NAMES),
                        help="comma-separated; default: all")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--traces", help="a folder: write each Thunder system's last traces "
                        "and each system's GPU ops of one step, in order")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.thunder needs a CUDA GPU")
    models = [m for m in args.models.split(",") if m]
    if args.traces:
        os.makedirs(args.traces, exist_ok=True)
    unknown = sorted(set(models) - set(MODEL_NAMES))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(MODEL_NAMES)}")
    if args.child:
        from fusecut.runtime import launcher

        launcher.native(wait=True)  # steps are timed on the path users get once it is built
        for step in args.steps.split(","):
            for model in models:
                run_model(step, model, args.iters, args.width,
                          lambda row, top: print(ROW_MARK + json.dumps([row, top]), flush=True),
                          args.traces)
        return
    device = torch.cuda.get_device_name()

    out = RunResults("thunder", device, "Thunder benchmark")

    def save(table: str, notes: str = "(partial: the run stopped here)") -> str:
        return str(out.write(table, notes))

    table, notes = run(args.steps.split(","), models, args.iters, args.width,
                       lambda line: print(line, flush=True), args.traces, save)
    print(table)
    print(notes)
    print(f"written to {save(table, notes)}")


if __name__ == "__main__":
    main()
