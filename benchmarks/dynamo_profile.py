"""Where a ``torch.compile(backend="fusecut")`` training step's time and memory go, region by
region (GPU).

One bf16 training step of a whole model (``benchmarks.whole_models``) under fusecut's backend,
profiled with each Region's call marked: per region its direction, ops, calls, host (CPU) and
GPU microseconds per call, its plan's segments and bytes (planned and the lower bound), and the
layout of its first call's inputs; then the GPU and host ops outside the regions that cost the
most, the partitioner's saved bytes, and the step's peak memory. It answers "why is this step
slower than torch.compile's" before anyone guesses.

    python -m benchmarks.dynamo_profile [--model hf_gpt2] [--steps 2] [--top 40] [--definitions DIR]

A region's GPU time is the span from its first kernel's start to its last one's end: where the
step waits on the host, the GPU's idle time between two launches of one region (a kernel and a
copy ATen makes after it) is in it. Without CUDA graphs GPT-2's mask region read 90 us for a
3 us kernel. GPU busy counts kernels, copies and memsets only.

Regions are named ``direction:name#serial``: a model's graphs (GPT-2's body and its loss) each
number their regions from 0, and the serial tells them apart. ``--definitions`` writes the top
regions' definitions (nvFuser's repro text) there, one file each, for ``fusecut codegen``.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

import torch

from benchmarks.common import RunResults, markdown_table
from benchmarks.thunder_models import MODELS, TRAIN_BATCH, attention_preference

MARK = "fusecut-region:"


@contextmanager
def labelled_regions():
    """Every Region call inside marked with a profiler range named after the region."""
    from fusecut.dynamo.regions import Region

    forward = Region.forward

    def marked(self, *args):
        with torch.profiler.record_function(_mark(self)):
            return forward(self, *args)

    Region.forward = marked
    try:
        yield
    finally:
        Region.forward = forward


def _mark(region) -> str:
    return f"{MARK}{region.direction}:{region.name}#{region.serial}"


def _layout(meta) -> str:
    shape = getattr(meta, "shape", None)
    if shape is None:
        return "scalar"
    stride = getattr(meta, "stride", None) or getattr(meta, "strides", None)
    dtype = str(getattr(meta, "dtype", "?")).split(".")[-1]
    return f"{dtype}{list(shape)}" + (f"/{list(stride)}" if stride is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="hf_gpt2", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=2, help="profiled steps")
    parser.add_argument("--top", type=int, default=40, help="rows per table")
    parser.add_argument("--definitions", metavar="DIR",
                        help="write the top regions' definitions here, one .py file each")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.dynamo_profile needs a CUDA GPU")
    import fusecut.dynamo
    from benchmarks.whole_models import whole_model
    from fusecut.dynamo.partition import partition_reports
    from fusecut.dynamo.regions import live_regions
    from fusecut.runtime import launcher

    launcher.native(wait=True)
    module, make_batch = whole_model(args.model, MODELS[args.model])
    module = module.to("cuda", torch.bfloat16).train()
    tokens, targets = make_batch(*TRAIN_BATCH[args.model], "cuda")
    compiled = torch.compile(module, backend=fusecut.dynamo.backend())

    def step():
        for p in module.parameters():
            p.grad = None
        compiled(tokens, targets).backward()

    with labelled_regions(), attention_preference(["torch.compile"]):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
    n = args.steps
    averages = prof.key_averages()
    regions = {_mark(r): r for r in live_regions()}
    rows, region_cpu, region_gpu = [], 0.0, 0.0
    for e in sorted((e for e in averages if e.key.startswith(MARK)),
                    key=lambda e: -e.device_time_total):
        region = regions.get(e.key)
        report = region.report() if region is not None else None
        calls = max(1, e.count)
        region_cpu += e.cpu_time_total / n
        region_gpu += e.device_time_total / n
        layouts = ", ".join(_layout(m) for m in (region.first_args or [])) if region else ""
        rows.append([e.key[len(MARK):], str(calls // n), f"{e.cpu_time_total / calls:.0f}",
                     f"{e.device_time_total / calls:.1f}",
                     " ".join(report.segments) if report else "",
                     f"{(report.planned_bytes or 0) / 2**20:.1f}" if report else "",
                     f"{(report.lower_bound_bytes or 0) / 2**20:.1f}" if report else "",
                     " ".join(report.ops[:10]) + (" ..." if report and len(report.ops) > 10
                                                  else "") if report else "",
                     layouts[:300]])
    if args.definitions:
        from pathlib import Path

        folder = Path(args.definitions)
        folder.mkdir(parents=True, exist_ok=True)
        for row in rows[:args.top]:
            region = regions.get(MARK + row[0])
            if region is not None:
                name = row[0].replace(":", "_").replace("#", "_")
                (folder / f"{name}.py").write_text(region.report().definition)
    region_table = markdown_table(
        ["region", "calls/step", "host us/call", "GPU us/call", "segments", "planned MiB",
         "floor MiB", "ops", "first inputs"], rows[:args.top])
    # device activity alone (kernels, copies, memsets): an ATen op's or a marker's own
    # "device time" is its kernels', counted again
    # (a region's mark is on the GPU's timeline too, spanning its kernels: counted once, as them)
    gpu_ops = sorted((e for e in averages if e.device_type.name == "CUDA"
                      and e.self_device_time_total > 0 and not e.key.startswith(MARK)),
                     key=lambda e: -e.self_device_time_total)
    gpu_table = markdown_table(["GPU op", "ms/step", "calls/step"], [
        [e.key[:90], f"{e.self_device_time_total / n / 1e3:.3f}", str(e.count // n)]
        for e in gpu_ops[:args.top]])
    cpu_ops = sorted((e for e in averages if not e.key.startswith(MARK)
                      and e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
    cpu_table = markdown_table(["host op", "self ms/step", "calls/step"], [
        [e.key[:90], f"{e.self_cpu_time_total / n / 1e3:.3f}", str(e.count // n)]
        for e in cpu_ops[:args.top]])
    copies = prof.key_averages(group_by_input_shape=True)
    copy_rows = sorted((e for e in copies if e.key in ("aten::copy_", "aten::clone",
                                                        "aten::contiguous", "aten::_to_copy")
                        and e.device_time_total > 0), key=lambda e: -e.device_time_total)
    copy_table = markdown_table(["copy op", "input shapes", "GPU ms/step", "calls/step"], [
        [e.key, str(e.input_shapes)[:120], f"{e.device_time_total / n / 1e3:.3f}",
         str(e.count // n)] for e in copy_rows[:args.top]])
    partitions = "; ".join(f"{p.partitioner}: {p.saved} saved, {p.saved_bytes / 2**20:.1f} MiB, "
                           f"{p.recomputed} recomputed"
                           for p in partition_reports())
    busy = sum(e.self_device_time_total for e in gpu_ops) / n / 1e3
    summary = (f"model {args.model}, bf16 training step {TRAIN_BATCH[args.model]}: "
               f"{len(regions)} regions; GPU busy {busy:.2f} ms/step, of it in regions "
               f"{region_gpu / 1e3:.2f} ms; host time inside region calls {region_cpu / 1e3:.2f} "
               f"ms/step; peak {peak:.2f} GiB; partitions: {partitions}")
    text = "\n\n".join([summary, "## Regions (by GPU time)", region_table,
                        "## GPU ops", gpu_table, "## Host ops", cpu_table,
                        "## Copies", copy_table])
    print(text)
    path = RunResults(f"dynamo-profile-{args.model}", torch.cuda.get_device_name(),
                      "Profile of a torch.compile(backend='fusecut') training step").write(
        text, f"PyTorch {torch.__version__}; {n} profiled steps after 3 warm ones.")
    print(f"written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
