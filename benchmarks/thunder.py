"""Thunder benchmark (GPU): one training step (forward and backward) of Thunder's own nanoGPT
``Block`` and llama2 ``TransformerBlock`` in bf16, through

- ``thunder.jit`` with fusecut (``fusecut_ex``, matmuls left to torch),
- ``thunder.jit`` with its torch executor,
- ``thunder.jit`` with its torch.compile executor,
- plain ``torch.compile``,

in one process, on the same weights and inputs. Time per step is the CUDA-event median of warm
steps; for fusecut, the bytes its regions planned against greedy and the lower bound, and the
kernels (segments) per step. Prints the table and writes it to benchmarks/results/.

    python -m benchmarks.thunder [--batch 8] [--seq 2048] [--width 2048] [--iters 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import traceback

import torch

from benchmarks.common import markdown_table, write_result


def models(width: int, seq: int):
    """(name, module, extra forward arguments) for each model, bf16 on the GPU."""
    import importlib

    import fusecut.thunder_executor  # noqa: F401  (readies torch before thunder's import)

    nanogpt_model = importlib.import_module("thunder.tests.nanogpt_model")
    llama2_model = importlib.import_module("thunder.tests.llama2_model")

    gpt = nanogpt_model.Block(nanogpt_model.GPTConfig(
        n_layer=1, n_head=width // 128, n_embd=width, block_size=seq, dropout=0.0, bias=True))
    args = llama2_model.ModelArgs(dim=width, n_layers=1, n_heads=width // 128,
                                  n_kv_heads=width // 256, max_seq_len=seq, dropout=0.0)
    llama = llama2_model.TransformerBlock(0, args)
    cos, sin = llama2_model.precompute_freqs_cis(args.dim // args.n_heads, seq)
    dev = "cuda"
    return [("nanogpt_block", gpt.to(dev, torch.bfloat16), ()),
            ("llama2_block", llama.to(dev, torch.bfloat16), (cos.to(dev), sin.to(dev)))]


def systems():
    import thunder
    from thunder.executors.torch_compile import torch_compile_ex

    from fusecut.thunder_executor import fusecut_ex

    return [
        ("thunder + fusecut", lambda m: thunder.jit(m, executors=[fusecut_ex])),
        ("thunder + torch", lambda m: thunder.jit(m, executors=[thunder.pytorch_executor])),
        ("thunder + torch.compile", lambda m: thunder.jit(m, executors=[torch_compile_ex])),
        ("torch.compile", lambda m: torch.compile(m)),
    ]


def step_time(fn, x, extra, grad, iters: int) -> float:
    def step():
        y = fn(x, *extra)
        y.backward(grad)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def fusecut_summary(jitted) -> tuple[str, str, str, str]:
    from fusecut.thunder_executor import region_reports

    reports = region_reports(jitted)
    planned = [r for r in reports if r.planned_bytes is not None]
    fallbacks = [r for r in reports if r.fallback]
    mib = lambda attr: f"{sum(getattr(r, attr) or 0 for r in planned) / 2**20:.0f}"  # noqa: E731
    kernels = sum(len(r.segments) for r in planned)
    note = f"{len(planned)} regions" + (f", {len(fallbacks)} on torch" if fallbacks else "")
    return f"{mib('planned_bytes')} / {mib('greedy_bytes')} / {mib('lower_bound_bytes')}", \
        str(kernels), note, "; ".join(r.summary() for r in fallbacks)


def run(batch: int, seq: int, width: int, iters: int) -> tuple[str, str]:
    torch.manual_seed(0)
    rows = []
    for name, model, extra in models(width, seq):
        x = torch.randn(batch, seq, width, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True)
        grad = torch.randn_like(x)
        for system, make in systems():
            candidate = copy.deepcopy(model)
            try:
                fn = make(candidate)
                start = time.perf_counter()
                fn(x, *extra).backward(grad)
                torch.cuda.synchronize()
                first = time.perf_counter() - start
                seconds = step_time(fn, x, extra, grad, iters)
                planned, kernels, note = "-", "-", f"first step {first:.1f} s"
                if "fusecut" in system:
                    planned, kernels, regions, why = fusecut_summary(fn)
                    note = f"{regions}; {note}" + (f"; {why}" if why else "")
                rows.append([name, system, f"{seconds * 1e3:.2f}", planned, kernels, note])
            except Exception as e:  # one failing system never aborts the table
                traceback.print_exc()
                rows.append([name, system, "-", "-", "-", f"{type(e).__name__}: {e}"[:160]])
            print(" | ".join(rows[-1]), flush=True)
            del candidate
            torch.cuda.empty_cache()
    headers = ["model", "system", "ms / step", "fusecut planned / greedy / lower bound MiB",
               "fusecut kernels / step", "note"]
    notes = (f"One training step (forward + backward with a fixed output gradient), bf16, batch "
             f"{batch}, sequence {seq}, width {width}; median of {iters} warm steps, CUDA events, "
             f"same process and weights; PyTorch {torch.__version__}. fusecut's executor leaves "
             f"matmuls, attention and everything it does not claim to Thunder's other "
             f"executors; its bytes and kernels are those of its own regions.")
    return markdown_table(headers, rows) + "\n", notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.thunder needs a CUDA GPU")
    table, notes = run(args.batch, args.seq, args.width, args.iters)
    print(table)
    print(notes)
    device = torch.cuda.get_device_name()
    print(f"written to {write_result('thunder', device, 'Thunder benchmark', table, notes)}")


if __name__ == "__main__":
    main()
