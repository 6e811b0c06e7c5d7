"""Planner benchmark (CPU): plan quality and planner speed.

For every corpus case and for generated fusions of 100 to 1,500 ops: op count, bytes moved by the
greedy (nvFuser-style) plan and by the optimised plan, the lower bound, io_ratio, segments, wall
time and solver status. Prints the table and writes it to benchmarks/results/.

    .venv/bin/python -m benchmarks.planner [--time-limit 5]
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import CORPUS, cpu_name, markdown_table, write_result
from benchmarks.fusiongen import generate
from optimizer.ir import parse_text
from optimizer.planner import PlanOptions, make_plan

MIB = 2**20


def run(time_limit: float) -> str:
    cases = [(p.stem, p.read_text()) for p in sorted(CORPUS.glob("*.py"))]
    cases += [(f"generated_{n}_ops", generate(n, seed=1)) for n in (100, 330, 700, 1500)]
    rows = []
    for name, text in cases:
        parsed = parse_text(text)
        start = time.perf_counter()
        plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=time_limit))
        wall = time.perf_counter() - start
        j = plan.to_json()
        tot, base = j["totals"], j["baseline"]
        rows.append([name, str(len(parsed.fusion.ops)), f"{base['io_bytes'] / MIB:.0f}",
                     str(base["segments"]), f"{tot['io_bytes'] / MIB:.0f}", str(tot["segments"]),
                     f"{tot['lower_bound_bytes'] / MIB:.0f}", f"{tot['io_ratio']:.3f}",
                     f"{base['io_bytes'] / max(tot['io_bytes'], 1):.2f}x", f"{wall:.2f}",
                     j["solver"]["status"]])
        print(" | ".join(rows[-1]), flush=True)
    headers = ["case", "ops", "greedy MiB", "greedy segs", "fusecut MiB", "segs",
               "lower bound MiB", "io_ratio", "saving", "plan s", "status"]
    return markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--time-limit", type=float, default=5.0)
    args = parser.parse_args()
    table = run(args.time_limit)
    print(table)
    path = write_result("planner", cpu_name(), "Planner benchmark", table,
                        f"Segmenter cpsat, time limit {args.time_limit} s, device profile H100. "
                        "MiB of global-memory traffic (reads + writes, compact storage).")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
