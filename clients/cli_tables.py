"""The tables the command line prints (``fusecut check``, ``plan`` and ``execute``), from the
rows its commands emit as JSON with --json; each prints on the console it is given."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from fusecut.optimizer.plan.render import human_bytes, human_rate, human_seconds

SUMMARY_OPS = 200  # `check` counts the ops of a larger fusion by op, not one row each


def _shape_text(shape: list[int] | None) -> str:
    if shape is None:
        return ""
    return "x".join(map(str, shape)) if shape else "scalar"


def print_definition(console: Console, rows_in: list[dict], rows_ops: list[dict],
                     rows_out: list[dict]) -> None:
    """``check``'s tables: the inputs, the ops (counted by op past SUMMARY_OPS) and the
    outputs."""
    table = Table(title="inputs")
    for col in ("name", "dtype", "declared", "shape", "strides"):
        table.add_column(col)
    for r in rows_in:
        table.add_row(r["name"], r["dtype"], str(r["declared"]), _shape_text(r["shape"]),
                      "" if r["strides"] is None else str(r["strides"]))
    console.print(table)
    if len(rows_ops) <= SUMMARY_OPS:
        ops = Table(title=f"ops ({len(rows_ops)})")
        for col in ("#", "op", "inputs", "outputs", "dtype", "shape"):
            ops.add_column(col)
        for r in rows_ops:
            ops.add_row(str(r["index"]), r["op"], ", ".join(r["inputs"]),
                        ", ".join(r["outputs"]), ", ".join(r["dtypes"]),
                        ", ".join(_shape_text(s) for s in r["shapes"]))
    else:  # a row per op: 20,000 ops printed 20,018 lines in 30 s (issue 32)
        ops = Table(title=f"ops ({len(rows_ops):,}, counted by op; --json lists each one)")
        for col in ("op", "count", "first", "last", "output dtypes"):
            ops.add_column(col, justify="right" if col in ("count", "first", "last") else "left")
        seen: dict[str, dict[str, Any]] = {}
        for r in rows_ops:
            entry = seen.setdefault(r["op"], {"count": 0, "first": r["index"], "dtypes": {}})
            entry["count"] += 1
            entry["last"] = r["index"]
            entry["dtypes"].update(dict.fromkeys(r["dtypes"]))
        for name, entry in sorted(seen.items(), key=lambda kv: (-kv[1]["count"], kv[0])):
            ops.add_row(name, f"{entry['count']:,}", f"#{entry['first']}", f"#{entry['last']}",
                        ", ".join(entry["dtypes"]))
    console.print(ops)
    outputs = Table(title="outputs")
    for col in ("name", "dtype", "shape"):
        outputs.add_column(col)
    for r in rows_out:
        outputs.add_row(r["name"], r["dtype"], _shape_text(r["shape"]))
    console.print(outputs)


def print_plan(console: Console, result: dict) -> None:
    """``plan``'s tables: the segments, the boundary tensors, the totals against greedy
    and the lower bound; the host program of stream-parallel axes."""
    segs = Table(title=f"plan {result['plan_id']} ({result['segmenter']}, "
                       f"{result['solver']['status']})")
    for col in ("#", "kind", "ops", "recomputed", "reads", "writes", "read", "write", "est"):
        segs.add_column(col, justify="right" if col in ("read", "write", "est") else "left")
    for s in result["segments"]:
        segs.add_row(str(s["index"]), s["kind"], str(len(s["ops"])),
                     str(len(s["recomputed_ops"])),
                     ", ".join(t["tensor"] for t in s["inputs"]),
                     ", ".join(t["tensor"] for t in s["outputs"]),
                     human_bytes(s["read_bytes"]), human_bytes(s["write_bytes"]),
                     human_seconds(s["est_time_s"]))
    console.print(segs)
    if result["boundaries"]:
        b = Table(title="boundary tensors")
        for col in ("tensor", "shape", "stored as", "dtype", "bytes", "from", "to", "why"):
            b.add_column(col)
        for t in result["boundaries"]:
            b.add_row(t["tensor"], "x".join(map(str, t["shape"])),
                      "x".join(map(str, t["compact_shape"])) or "scalar", t["dtype"],
                      human_bytes(t["bytes"]), str(t["producer"]),
                      ", ".join(map(str, t["consumers"])), t["reason"])
        console.print(b)
    else:
        console.print("no tensor crosses between segments")
    tot, base = result["totals"], result["baseline"]
    summary = Table(title="totals", show_header=True)
    for col in ("", "I/O bytes", "segments", "est time"):
        summary.add_column(col)
    summary.add_row("fusecut", human_bytes(tot["io_bytes"]), str(tot["segments"]),
                    human_seconds(tot["est_time_s"]))
    summary.add_row("greedy (nvFuser-style)", human_bytes(base["io_bytes"]), str(base["segments"]),
                    human_seconds(base["est_time_s"]))
    summary.add_row("lower bound", human_bytes(tot["lower_bound_bytes"]), "",
                    human_seconds(tot["floor_s"]))
    console.print(summary)
    console.print(f"io_ratio {tot['io_ratio']:.3f}; saved {human_bytes(base['saved_bytes'])} "
                  f"against greedy; solver {result['solver']['status']} in "
                  f"{result['solver']['wall_s']:.2f} s ({result['solver']['message']})")
    if result.get("host_program"):  # stream-parallel axes: the host program
        console.print("host program:")
        console.print(result["host_program"], markup=False, highlight=False, soft_wrap=True)


def print_execution(console: Console, names: list[str], device: str, result: Any,
                    segments: list[dict], worst: float | None) -> None:
    """``execute``'s tables: times per segment, the outputs, the difference (None: unchecked)."""
    table = Table(title=f"execution on {device} ({result.backend})")
    for col in ("segment", "kind", "time", "bytes", "bandwidth"):
        table.add_column(col, justify="right")
    for s in segments:
        table.add_row(str(s["index"]), s["kind"], human_seconds(s["seconds"]),
                      human_bytes(s["bytes"]), human_rate(s["bytes_per_second"])
                      if s["bytes_per_second"] is not None else "")
    console.print(table)
    for name, value in zip(names, result.outputs):
        console.print(f"{name}: {list(value.shape)} {value.dtype}")
    if worst is not None:
        if result.backend == "reference":  # the CPU path runs each segment through torch
            console.print(f"largest difference of the segment-by-segment run from the "
                          f"whole-fusion torch reference: {worst:.3g} (on the CPU each segment "
                          f"runs the torch reference; this checks the segmentation, not generated "
                          f"kernels)")
        else:
            console.print(f"largest difference of the generated kernels from the torch "
                          f"reference: {worst:.3g}")
