"""Layout kernels against copy bandwidth (GPU): the tiled transpose and grouped normalization,
each beside the variants it was chosen over.

    python -m benchmarks.tiles [--iters 30]

Cases: transpose_add (corpus), a transposing copy in bf16 and float32 (a contiguous() of a
transposed 8192 x 8192 tensor), group_norm_fwd (corpus). Variants: the untiled pointwise kernel
and 32/64 tiles for the transposes; for group norm, rows streamed through shared memory
against rows held in registers by 1024 or 256 threads. Each time is the mean of a burst of
back-to-back calls (CUDA events around the burst, so host time between launches hides behind
the kernels), the median of ``--iters`` bursts; the fraction is the
logical lower-bound bytes over that time, against a device-to-device copy measured here.
Writes benchmarks/results/tiles-<device>-<date>.md.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from unittest import mock

import torch

from benchmarks.common import CORPUS, write_result
from benchmarks.kernels import copy_bandwidth, logical_lower_bound
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.kernels import cuda_runner
from fusecut.runtime.tensors import make_input
from tests.helpers import fusion

BURST = 10
COPY_T = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.{dt})
fd.add_output(fd.ops.permute(T0, dims=[1, 0]))
"""
UNTILED = {"fusecut.codegen.pointwise.generate_transpose": lambda *a, **k: None}
TRANSPOSE_VARIANTS = {"pointwise (untiled)": UNTILED,
                      "tiles 64": {"fusecut.codegen.transpose.TILES": (64,)},
                      "tiles 32": {"fusecut.codegen.transpose.TILES": (32,)}}
NORM_VARIANTS = {"rows streamed through shared memory": {}} | {
    f"rows in registers, {n} threads per row": {"fusecut.codegen.launch.NORM_MAX_THREADS": n,
                                                "fusecut.codegen.launch.NORM_STREAM_BYTES": 1 << 40}
    for n in (1024, 256)}


def cases():
    for name in ("transpose_add", "group_norm_fwd"):
        parsed = parse_text((CORPUS / f"{name}.py").read_text())
        variants = NORM_VARIANTS if name.startswith("group") else TRANSPOSE_VARIANTS
        yield name, parsed.fusion, parsed.inputs, variants
    for dt, d in (("BFloat16", DType.bfloat16), ("Float", DType.float32)):
        yield (f"transposing copy {d.value}", fusion(COPY_T.format(dt=dt)),
               [tensor_meta((8192, 8192), d)], TRANSPOSE_VARIANTS)


def time_burst(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BURST):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / BURST)
    return statistics.median(times)


def measure(f, metas, patches: dict, iters: int) -> tuple[float, int, str]:
    import fusecut.runtime.kernels as rk

    with ExitStack() as stack:
        for target, value in patches.items():
            stack.enter_context(mock.patch(target, value))
        rk._code.clear()
        plan = make_plan(f, metas, PlanOptions(time_limit_s=5))
        torch.manual_seed(0)
        args = [make_input(m, "cuda") for m in metas]
        kinds = "+".join(s.kind.value for s in plan.segments)
        t = time_burst(lambda: execute_plan(plan, args, cuda_runner, "cuda"), iters)
        rk._code.clear()
        return t, logical_lower_bound(plan), kinds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tiles", description=__doc__)
    parser.add_argument("--iters", type=int, default=30)
    opts = parser.parse_args(argv)
    bw = copy_bandwidth()
    lines = ["| case | variant | segments | time us | GB/s | fraction of copy |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, f, metas, variants in cases():
        for variant, patches in variants.items():
            try:
                t, nbytes, kinds = measure(f, metas, patches, opts.iters)
            except Exception as exc:  # one variant failing keeps the others
                lines.append(f"| {name} | {variant} | - | - | - | failed: {exc} |")
                continue
            lines.append(f"| {name} | {variant} | {kinds} | {t * 1e6:.1f} | "
                         f"{nbytes / t / 1e9:.0f} | {nbytes / t / bw:.2f} |")
            print(lines[-1], flush=True)
    notes = (f"- Copy bandwidth (device-to-device, read + write): {bw / 1e9:.0f} GB/s.\n"
             f"- Time: mean of {BURST} back-to-back runs of the plan (execute_plan; CUDA events "
             f"around the burst), median of {opts.iters} bursts; bytes: the logical lower bound.")
    path = write_result("tiles", torch.cuda.get_device_name(),
                        "Tiled transpose and grouped normalization against copy bandwidth",
                        "\n".join(lines), notes)
    print(path)


if __name__ == "__main__":
    main()
