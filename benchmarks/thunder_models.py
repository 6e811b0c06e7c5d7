"""Whole-model benchmark (GPU): language models trained and served through Thunder with fusecut,
against Thunder + nvFuser, torch.compile and eager.

Models (``benchmarks.whole_models``), bf16:
- ``nanogpt``: Thunder's nanoGPT ``GPT`` at GPT-2-small size (12 layers, width 768, vocab 50304);
- ``llama3``: the Llama-3-style LM, 4 layers at width 2048 (16 heads, 4 KV heads, vocab 32000);
- ``hf_gpt2`` and ``hf_llama``: Hugging Face transformers' ``GPT2LMHeadModel`` and
  ``LlamaForCausalLM`` (tied embeddings) at those two sizes (random weights from their configs).

Steps:
- ``train``: forward with the loss, and backward (gradients set to None first); nanoGPT at
  batch 8 x 1024, llama3 at 2 x 2048;
- ``infer1``: batch 1, sequence 128, logits under no_grad (host-bound);
- ``infer8``: batch 8 prefill at sequence 2048 (nanoGPT: its 1024 positions), under no_grad.

Systems, each in a process of its own (one system's CUDA fault, which poisons the process's
context, costs no other system its rows; every process starts from empty compile caches):
- ``thunder+nvfuser``: ``thunder.jit(m)``, Thunder's default executors (cuDNN or SDPA attention,
  the torch.compile cross-entropy executor, nvFuser);
- ``thunder+fusecut``: ``thunder.jit(m, executors=fusecut.thunder.executors(),
  transforms=fusecut.thunder.transforms())`` (tied parameters as one value, which changes these
  models: rows before 2026-11-28 had no transforms, so autograd summed the tied weight's two
  gradients);
- ``thunder+fusecut+cudagraphs``: the same with Thunder's ``CUDAGraphTransform`` added;
- ``thunder+fusecut+handover-cudagraphs``: the same with ``fusecut.thunder.CUDAGraphTransform``
  added (Thunder's CUDA graphs, whose gradients autograd takes over without a copy);
- ``thunderfx+fusecut``: ``thunder.dynamo.thunderfx(m, executors=fusecut.thunder.executors())``
  (torch.compile's Dynamo captures the graph, Thunder compiles it: a shorter first step);
- ``thunder+torch``: Thunder with no fusion executor (its SDPA and torch executors): what
  Thunder's own tracing costs the first step;
- ``torch.compile+fusecut``: ``torch.compile(m, backend="fusecut")`` (``fusecut.dynamo``:
  AOTAutograd, fusecut's partitioner and regions);
- ``torch.compile+fusecut+cudagraphs``: the same with ``mode="reduce-overhead"`` (each compiled
  graph recorded as a CUDA graph in Inductor's CUDA graph trees, ``fusecut.dynamo.cuda_graphs``);
- ``torch.compile``, ``torch.compile+reduce-overhead`` (its CUDA graphs) and ``eager``, with SDPA
  preferring cuDNN attention.

Per row: the synchronized step (median ms over rounds of steps, each synchronized, with the 95%
bootstrap interval of its ratio to torch.compile's, ``benchmarks.intervals``), the pipelined step
(10 steps back to back, one synchronize: as a training loop runs), the step's peak memory, the
first step's seconds from empty caches, GPU busy ms per step and the top GPU ops (torch.profiler).
Rows are appended to the result file as they come.

With ``--paired`` (or ``--only-paired``), each model also runs in one more process holding every
system but Thunder + nvFuser beside torch.compile, their rounds interleaved: the same clocks for
all, so the fairest step-time ratios (one-system processes can land on different GPU clocks).

    python -m benchmarks.thunder_models [--models nanogpt,llama3] [--systems ...]
        [--steps train,infer1,infer8] [--gpus 0,1] [--iters 24] [--paired | --only-paired]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from benchmarks.common import RunResults, markdown_table
from benchmarks.intervals import median_ratio_interval

MODELS = {"nanogpt": "gpt2_small", "llama3": "llama_2048",  # model -> size
          "hf_gpt2": "gpt2_small", "hf_llama": "llama_2048"}
TRAIN_BATCH = {"nanogpt": (8, 1024), "llama3": (2, 2048), "hf_gpt2": (8, 1024),
               "hf_llama": (2, 2048)}
STEPS = ("train", "infer1", "infer8")
SYSTEMS = ("thunder+nvfuser", "thunder+fusecut", "thunder+fusecut+cudagraphs",
           "thunder+fusecut+handover-cudagraphs", "thunderfx+fusecut", "thunder+torch",
           "torch.compile+fusecut", "torch.compile+fusecut+cudagraphs", "torch.compile",
           "torch.compile+reduce-overhead", "eager")
BASELINE = "torch.compile"
PIPELINED = 10  # steps back to back
ROW_MARK = "ROW\t"
HEADERS = ["model", "step", "system", "sync ms", f"vs {BASELINE} (95% interval)", "pipelined ms",
           f"pipelined vs {BASELINE} (95%)", "peak GiB", "first step s", "warm first step s",
           "GPU busy ms", "note"]


def batch_of(model: str, step: str, max_seq: int) -> tuple[int, int]:
    if step == "train":
        return TRAIN_BATCH[model]
    if step == "infer1":
        return 1, 128
    return 8, min(2048, max_seq)


# ---- one system, in its own process -------------------------------------------------------------


def build(system: str, module: torch.nn.Module) -> Callable:
    if system == "eager":
        return module
    if system == "torch.compile":
        return torch.compile(module)
    if system == "torch.compile+reduce-overhead":
        return torch.compile(module, mode="reduce-overhead")
    if system == "torch.compile+fusecut":
        return torch.compile(module, backend="fusecut")
    if system == "torch.compile+fusecut+cudagraphs":
        return torch.compile(module, backend="fusecut", mode="reduce-overhead")
    from fusecut.thunder.executor import thunder

    if system == "thunder+nvfuser":
        names = [e.name for e in thunder.get_default_executors()]
        if "nvfuser" not in names:
            raise RuntimeError(f"nvFuser is not among Thunder's executors here ({names})")
        return thunder.jit(module)
    if system == "thunder+torch":
        return thunder.jit(module, executors=[thunder.extend.get_executor("sdpa"),
                                              thunder.extend.get_executor("torch")])
    import fusecut.thunder

    if system == "thunder+fusecut":
        return thunder.jit(module, executors=fusecut.thunder.executors(),
                           transforms=fusecut.thunder.transforms())
    if system == "thunder+fusecut+cudagraphs":
        from thunder.transforms.cudagraph import CUDAGraphTransform

        return thunder.jit(module, executors=fusecut.thunder.executors(),
                           transforms=[*fusecut.thunder.transforms(), CUDAGraphTransform()])
    if system == "thunder+fusecut+handover-cudagraphs":
        return thunder.jit(module, executors=fusecut.thunder.executors(),
                           transforms=fusecut.thunder.transforms(cuda_graphs=True))
    if system == "thunderfx+fusecut":
        from thunder.dynamo import thunderfx

        return thunderfx(module, executors=fusecut.thunder.executors())
    raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")


def attention_preference(systems: list[str]):
    """Eager and torch.compile (every backend) run SDPA: prefer cuDNN's attention there, as
    fusecut's and Thunder's cudnn executors do for the Thunder systems (which call their
    attention kernels directly: the preference does not touch them)."""
    from contextlib import nullcontext

    if not any(s == "eager" or s.startswith("torch.compile") for s in systems):
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], set_priority=True)


def step_fn(fn: Callable, module: torch.nn.Module, tokens, targets, train: bool) -> Callable:
    def train_step():
        for p in module.parameters():
            p.grad = None
        fn(tokens, targets).backward()

    def infer_step():
        with torch.no_grad():
            fn(tokens)

    return train_step if train else infer_step


@dataclass
class Measured:
    sync_s: list[float]
    pipelined_s: list[float]  # per step, one value per burst of PIPELINED steps
    pipelined_ms: float
    peak_gib: float | None
    first_s: float | None
    busy_ms: float
    top: str


ROUNDS = 6


def first_step(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def one_round(run: Callable[[], None], sync: list[float], pipelined: list[float],
              steps: int) -> None:
    """``steps`` synchronized steps, then a burst of PIPELINED steps back to back."""
    for _ in range(steps):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        sync.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(PIPELINED):
        run()
    torch.cuda.synchronize()
    pipelined.append((time.perf_counter() - t0) / PIPELINED)


def step_peak_gib(run: Callable[[], None]) -> float:
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    # all the step holds at its peak, weights and a CUDA graph's pool included: what it needs
    return torch.cuda.max_memory_allocated() / 2**30


def measure(run: Callable[[], None], iters: int, rounds: int = ROUNDS) -> Measured:
    first = first_step(run)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):  # warm: allocator, autotuning, CUDA graph capture
        run()
    torch.cuda.synchronize()
    # a CUDA graph's pool is allocated when it records, and a replay allocates nothing: a
    # replayed step's own peak would leave the graph's working memory out
    recorded_peak = torch.cuda.max_memory_allocated() / 2**30
    sync: list[float] = []
    pipelined: list[float] = []
    for _ in range(rounds):  # rounds with a pipelined burst between: clocks settle alike
        one_round(run, sync, pipelined, max(1, iters // rounds))
    peak = max(step_peak_gib(run), recorded_peak)
    busy, top = profile(run)
    return Measured(sync, pipelined, statistics.median(pipelined) * 1e3, peak, first, busy, top)


def measure_paired(runs: dict[str, Callable[[], None]], iters: int, rounds: int = ROUNDS
                   ) -> dict[str, Measured]:
    """Several systems in one process, their rounds interleaved (the order rotating each round),
    so that clock and thermal drift fall on all of them alike: the fairest ratio of step times.
    First step and peak memory are left to the one-system processes (here they would include
    the other systems' caches and CUDA graph pools)."""
    names = list(runs)
    for name in names:
        first_step(runs[name])
        for _ in range(2):
            runs[name]()
    torch.cuda.synchronize()
    sync = {n: [] for n in names}
    pipelined = {n: [] for n in names}
    for r in range(rounds * 2):
        for name in names[r % len(names):] + names[:r % len(names)]:
            one_round(runs[name], sync[name], pipelined[name], max(1, iters // rounds))
    out = {}
    for name in names:
        busy, top = profile(runs[name])
        out[name] = Measured(sync[name], pipelined[name],
                             statistics.median(pipelined[name]) * 1e3, None, None, busy, top)
    return out


def profile(run: Callable[[], None], steps: int = 3) -> tuple[float, str]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    ops = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    busy = sum(e.self_device_time_total for e in ops) / 1e3 / steps
    top = sorted(ops, key=lambda e: -e.self_device_time_total)[:5]
    text = "; ".join(f"{e.key[:60]} {e.self_device_time_total / 1e3 / steps:.2f} ms "
                     f"x{e.count / steps:.0f}" for e in top)
    return busy, text.replace("|", "/")


def run_child(model_name: str, systems: list[str], steps: list[str], iters: int, emit,
              rounds: int = ROUNDS, first_only: bool = False) -> None:
    """One system (or, paired, several in rounds interleaved) on one model, step by step."""
    from benchmarks.whole_models import whole_model

    if any("fusecut" in s for s in systems):
        from fusecut.runtime import launcher

        launcher.native(wait=True)  # steps are timed on the path users get once it is built
    size = MODELS[model_name]
    module, make_batch = whole_model(model_name, size)
    module = module.to("cuda", torch.bfloat16)
    # one preference for the whole process, set once as a user sets it (not around each step)
    with attention_preference(systems):
        _run_steps(model_name, systems, steps, iters, emit, module, make_batch, size, rounds,
                   first_only)


def _run_steps(model_name, systems, steps, iters, emit, module, make_batch, size,
               rounds, first_only=False) -> None:
    from benchmarks.whole_models import SIZES

    for step in steps:
        train = step == "train"
        module.train(train)
        batch, seq = batch_of(model_name, step, SIZES[size].max_seq)
        tokens, targets = make_batch(batch, seq, "cuda")
        row = {"model": model_name, "step": step, "batch": f"{batch}x{seq}"}
        try:
            fns, runs = {}, {}
            for system in systems:
                fns[system] = build(system, module)  # a jitted function per step
                runs[system] = step_fn(fns[system], module, tokens,
                                       targets if train else None, train)
            if first_only:  # a second process over the first one's caches: the warm start
                for system in systems:
                    emit({**row, "system": system, "warm_s": first_step(runs[system])})
                continue
            if len(systems) == 1:
                measured = {systems[0]: measure(runs[systems[0]], iters, rounds)}
            else:
                measured = measure_paired(runs, iters, rounds)
            for system, m in measured.items():
                note = fusecut_note(fns[system]) if "fusecut" in system else ""
                if len(systems) > 1:
                    note = ("paired; " + note) if note else "paired"
                emit({**row, "system": system, **m.__dict__, "note": note})
        except Exception as e:  # the next step may still run
            traceback.print_exc()
            for system in systems:
                emit({**row, "system": system, "error": one_line(e)})
        torch.cuda.empty_cache()


def fusecut_note(fn) -> str:
    """Regions, those that fell back, and fusecut's part of the first step by stage."""
    if isinstance(fn, torch._dynamo.eval_frame.OptimizedModule):  # backend="fusecut"
        import fusecut.dynamo

        return _note(fusecut.dynamo.region_reports())
    from fusecut.thunder.reports import region_reports

    if hasattr(fn, "_backend"):  # thunderfx: one Thunder function per Dynamo subgraph
        jitted = [f for info in fn._backend.subgraph_infos for f in info.thunder_compiled_fns]
    else:
        jitted = [fn]
    return _note([r for f in jitted for r in region_reports(f)])


def _note(reports: list) -> str:
    fell_back = [r for r in reports if r.fallback]
    setup: dict[str, float] = {}
    for r in reports:
        for name, seconds in r.setup_seconds.items():
            setup[name] = setup.get(name, 0.0) + seconds
    note = f"{len(reports)} fusecut regions"
    if setup:
        note += (f", set up in {sum(setup.values()):.1f} s ("
                 + ", ".join(f"{k} {v:.1f}" for k, v in setup.items()) + ")")
    if fell_back:
        note += f", {len(fell_back)} on torch ({one_line(fell_back[0].fallback)})"
    return note


def one_line(e: BaseException | str) -> str:
    text = f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else e
    return text.replace("\n", " ").replace("|", "/")[:160]


# ---- the parent: processes, rows, the table ------------------------------------------------------


def child_results(model: str, system: str, steps: list[str], iters: int, gpu: str | None,
                  timeout: float, log, rounds: int = ROUNDS, warm: bool = False) -> list[dict]:
    """Run one system on one model in a fresh process with empty compile caches; with ``warm``,
    then the first step once more in a second process over the caches the first one left (what
    a script's rerun pays)."""
    with tempfile.TemporaryDirectory(prefix="fusecut-bench-") as cache:
        env = dict(os.environ, FUSECUT_CACHE_DIR=f"{cache}/fusecut",
                   TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", TRITON_CACHE_DIR=f"{cache}/triton")
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        command = [sys.executable, "-m", "benchmarks.thunder_models", "--child", "--models", model,
                   "--systems", system, "--steps", ",".join(steps), "--iters", str(iters),
                   "--rounds", str(rounds)]
        systems = system.split(",")
        results, last = [], "no output"
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=timeout)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as e:
            output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            code = f"timed out after {timeout:.0f} s"
        for line in output.splitlines():
            if line.startswith(ROW_MARK):
                results.append(json.loads(line[len(ROW_MARK):]))
            elif line.strip():
                last = line.strip()
        done = {(r["step"], r["system"]) for r in results}
        for step in steps:
            for one in systems:
                if (step, one) not in done:
                    results.append({"model": model, "step": step, "system": one,
                                    "error": f"not run: the process ended ({code}): "
                                             f"{one_line(last)}"})
        if len(systems) > 1:
            for r in results:
                r["paired"] = True
        elif warm:
            _add_warm_first_steps(results, command + ["--first-only"], env, timeout)
        log(f"{model} {system}: {len(results)} rows")
        return results


def _add_warm_first_steps(results: list[dict], command: list[str], env: dict,
                          timeout: float) -> None:
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        output = done.stdout
    except subprocess.TimeoutExpired:
        return
    warm = {}
    for line in output.splitlines():
        if line.startswith(ROW_MARK):
            row = json.loads(line[len(ROW_MARK):])
            warm[row["step"], row["system"]] = row.get("warm_s")
    for r in results:
        r["warm_s"] = warm.get((r["step"], r["system"]))


def table_rows(results: list[dict]) -> list[list[str]]:
    """One row per result; ratios to the baseline measured the same way (paired rows to the
    paired baseline, one-system processes to the baseline's own process)."""
    def key(r):
        return r["model"], r["step"], bool(r.get("paired"))

    baseline = {key(r): r for r in results if r["system"] == BASELINE and "sync_s" in r}
    rows = []
    order = {s: i for i, s in enumerate(SYSTEMS)}
    for r in sorted(results, key=lambda r: (r["model"], STEPS.index(r["step"]),
                                            bool(r.get("paired")), order.get(r["system"], 99))):
        head = [r["model"], f"{r['step']} ({r.get('batch', '?')})", r["system"]]
        if "error" in r:
            rows.append(head + ["-"] * (len(HEADERS) - 4) + [r["error"]])
            continue
        base = baseline.get(key(r))
        mine = r["system"] == BASELINE or base is None
        ratio = "-" if mine else str(median_ratio_interval(r["sync_s"], base["sync_s"]))
        pipelined = r.get("pipelined_s") or []
        piped = ("-" if mine or not pipelined or not base.get("pipelined_s")
                 else str(median_ratio_interval(pipelined, base["pipelined_s"])))
        rows.append(head + [f"{statistics.median(r['sync_s']) * 1e3:.2f}", ratio,
                            f"{r['pipelined_ms']:.2f}", piped, _number(r.get("peak_gib"), 2),
                            _number(r.get("first_s"), 1), _number(r.get("warm_s"), 1),
                            f"{r['busy_ms']:.2f}", r["note"]])
    return rows


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(results: list[dict], iters: int, rounds: int = ROUNDS) -> tuple[str, str]:
    tops = [[r["model"], r["step"], r["system"] + (" (paired)" if r.get("paired") else ""),
             r["top"]] for r in results if "top" in r]
    table = (markdown_table(HEADERS, table_rows(results)) + "\n\n## Top GPU ops per step\n\n"
             + markdown_table(["model", "step", "system", "top GPU ops (ms / step, calls)"],
                              tops))
    notes = (f"bf16. sync ms: median of {iters} steps, each synchronized, taken in {rounds} rounds "
             f"with a pipelined burst between; the ratio to {BASELINE} with the middle 95% of 2000 "
             f"bootstrap resamples of both. pipelined ms: the median over the rounds' bursts of "
             f"{PIPELINED} steps back to back, one synchronize each, per step, and its ratio the "
             f"same way. Rows noted 'paired' ran in one process with the baseline, their rounds "
             f"interleaved (clock drift falls on both alike); their ratios are to the paired "
             f"baseline, their peak and first step are left to the one-system rows. "
             f"peak GiB: the most allocated during one step (or during the two steps after the "
             f"first, where a CUDA graph records its pool: a replay allocates nothing), weights "
             f"included; rows up to 2026-11-29-6 measured CUDA graph systems on a replay "
             f"alone, which left the pool out. first step s: from a new process's empty "
             f"fusecut, Inductor and Triton caches (Thunder's tracing and fusecut's planning "
             f"and NVRTC compiles, or torch.compile's); warm first step s: the same in a second "
             f"process over the caches the first left (a script's rerun; with --warm). GPU busy "
             f"ms: torch.profiler over 3 steps. A training step is forward with the loss and "
             f"backward (no optimizer). Each model and system runs in a process of its own. "
             f"PyTorch {torch.__version__}.")
    return table, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--iters", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds of synchronized steps and a pipelined burst (twice as many "
                             "when paired); more narrow the intervals")
    parser.add_argument("--gpus", default=None, help="comma-separated devices to run processes "
                        "on side by side (default: one process at a time on the visible GPU)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per process")
    parser.add_argument("--paired", action="store_true",
                        help=f"also run the systems with {BASELINE} in one process per model, "
                             "rounds interleaved, for the fairest step-time ratios")
    parser.add_argument("--only-paired", action="store_true",
                        help="only the paired processes (no one-system processes)")
    parser.add_argument("--warm", action="store_true",
                        help="also time each one-system process's first step again in a second "
                             "process over the caches the first left (a script's rerun)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    models, systems = args.models.split(","), args.systems.split(",")
    steps = args.steps.split(",")
    for given, known, what in ((models, MODELS, "models"), (systems, SYSTEMS, "systems"),
                               (steps, STEPS, "steps")):
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise SystemExit(f"unknown {what} {unknown}; known: {', '.join(known)}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.thunder_models needs a CUDA GPU")
    if args.child:
        [model] = models
        run_child(model, systems, steps, args.iters,
                  lambda row: print(ROW_MARK + json.dumps(row), flush=True), args.rounds,
                  args.first_only)
        return
    device = torch.cuda.get_device_name()
    gpus = args.gpus.split(",") if args.gpus else [None]
    # system by system, in the order given (each system's models side by side on --gpus): a run
    # cut short keeps whole systems
    jobs = [] if args.only_paired else [(m, s) for s in systems for m in models]
    if args.paired or args.only_paired:  # the safe systems beside the baseline, one process
        paired = [s for s in systems if s not in (BASELINE, "thunder+nvfuser")] + [BASELINE]
        jobs += [(m, ",".join(paired)) for m in models]
    results: list[dict] = []
    out = RunResults("thunder-models", device, "Whole-model Thunder benchmark")

    def save(final: bool = False) -> str:
        table, notes = report(results, args.iters, args.rounds)
        return str(out.write(table, notes if final else notes + "\n\n(partial: still running)"))

    free = list(gpus)

    def run_job(job):
        gpu = free.pop()
        try:
            return child_results(*job, steps, args.iters, gpu, args.timeout,
                                 lambda line: print(line, flush=True), args.rounds, args.warm)
        finally:
            free.append(gpu)

    with ThreadPoolExecutor(len(gpus)) as pool:
        for rows in pool.map(run_job, jobs):
            results.extend(rows)
            save()
    path = save(final=True)
    print(report(results, args.iters, args.rounds)[0])
    print(f"written to {path}")


if __name__ == "__main__":
    main()
