"""Another client of the service, in a process of its own: ``python healthz_poller.py URL``.

It GETs ``URL/healthz`` once and prints ``ready``, then every 20 ms until a line (or EOF) arrives
on stdin, then prints each poll's latency in seconds as one JSON list. Its own process and its
collector off keep its latencies the service's: polling from the test process measured that
process's collector too (gen-2 collections of 100-300 ms once the suite has run for a while).
"""

from __future__ import annotations

import gc
import json
import select
import sys
import time

import httpx


def poll(url: str) -> list[float]:
    gc.disable()  # a few hundred small responses: nothing to collect
    latencies = []
    with httpx.Client(base_url=url, timeout=30) as client:
        client.get("/healthz").raise_for_status()  # the connection is open before the load
        print("ready", flush=True)
        while not select.select([sys.stdin], [], [], 0.02)[0]:
            start = time.perf_counter()
            answer = client.get("/healthz")
            latencies.append(time.perf_counter() - start)
            if answer.status_code != 200:
                sys.exit(f"/healthz answered {answer.status_code}: {answer.text[:200]}")
    return latencies


if __name__ == "__main__":
    print(json.dumps(poll(sys.argv[1])), flush=True)
