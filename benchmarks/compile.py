"""Compile-time benchmark (no GPU needed): NVRTC time per corpus case, cold (empty caches), warm
(in-process memory cache) and in a new process (disk cache).

    python -m benchmarks.compile [--arch sm_90]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import CORPUS, cpu_name, markdown_table, write_result

CHILD = """
import sys, time
import fusecut.runtime.compile as rc
from fusecut.codegen import generate_segment
from fusecut import load
from fusecut.optimizer.planner import PlanOptions, make_plan
sources = []
for path in sys.argv[2:]:
    p = load(path)
    plan = make_plan(p.fusion, p.inputs, PlanOptions(segmenter="greedy"))
    sources += [generate_segment(plan, s) for s in plan.segments]
start = time.perf_counter()
for sk in sources:
    if sk.kernels:
        rc.compile_cubin(sk.source, sys.argv[1], sk.kernels[0].name)
print(time.perf_counter() - start, rc.STATS.compiles, rc.STATS.disk_hits)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    import fusecut.runtime.compile as rc
    from fusecut import load
    from fusecut.codegen import generate_segment
    from fusecut.optimizer.planner import PlanOptions, make_plan

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["FUSECUT_CACHE_DIR"] = cache
        rc.clear_memory_cache()
        paths = sorted(CORPUS.glob("*.py"))
        total_cold = total_warm = 0.0
        kernels = 0
        for path in paths:
            parsed = load(path)
            plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(segmenter="greedy"))
            sources = [generate_segment(plan, s) for s in plan.segments]
            sources = [sk for sk in sources if sk.kernels]
            start = time.perf_counter()
            for sk in sources:
                rc.compile_cubin(sk.source, args.arch, sk.kernels[0].name)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            for sk in sources:
                rc.compile_cubin(sk.source, args.arch, sk.kernels[0].name)
            warm = time.perf_counter() - start
            total_cold += cold
            total_warm += warm
            kernels += sum(len(sk.kernels) for sk in sources)
            rows.append([path.stem, str(len(sources)), f"{cold * 1e3:.0f}", f"{warm * 1e6:.0f}"])
        env = dict(os.environ, FUSECUT_CACHE_DIR=cache)
        child = subprocess.run([sys.executable, "-c", CHILD, args.arch, *map(str, paths)],
                               capture_output=True, text=True, env=env, check=True)
        disk_s, compiles, disk_hits = child.stdout.split()
    rows.append(["all", str(kernels) + " kernels", f"{total_cold * 1e3:.0f}",
                 f"{total_warm * 1e6:.0f}"])
    table = markdown_table(["case", "sources", "cold ms (NVRTC)", "warm us (memory cache)"], rows)
    notes = (f"Architecture {args.arch}. A new process with the disk cache loaded every cubin in "
             f"{float(disk_s) * 1e3:.0f} ms with {compiles} compilation(s) and {disk_hits} disk "
             f"hit(s).")
    print(table)
    print(notes)
    print(f"written to {write_result('compile', cpu_name(), 'Compile time', table, notes)}")


if __name__ == "__main__":
    main()
