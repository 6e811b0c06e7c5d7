"""Executions queue boundedly: a small execution does not wait behind a slow one while another
worker is free, a full queue is a 503 and a client over its share a 429, both with
``Retry-After``.

From the hostile-input reviews of issue 19 (defect 15) and issue 32 (defect 11: without an API
key, a client is its address, whatever Authorization header it makes up).
"""

from __future__ import annotations

import time

import httpx

from tests.server import Server
from tests.service.probes import in_thread, wait_until_executing
from tests.service.test_service import assert_problem
from tests.service.workloads import NEG, heavy_request

# the execution held while others arrive: about 4x the usual heavy one (5 s idle), so that in a
# loaded full run it is still running when the next request has been built, sent and planned
HELD_LINKS = 480


def test_a_small_execution_does_not_wait_behind_a_slow_one(server):
    slow, answer = in_thread(lambda: heavy_request(server.url))
    wait_until_executing(server.url)  # on one of the two workers
    start = time.monotonic()
    small = httpx.post(f"{server.url}/v1/execute", timeout=60, json={
        "definition": NEG, "inputs": [{"name": "T0", "shape": [2], "datatype": "FP32",
                                       "data": [1, 2]}]})
    took = time.monotonic() - start
    assert small.status_code == 200 and small.json()["outputs"][0]["data"] == [-1, -2]
    # answered on the other worker: with one, it waited for the slow one to end
    assert slow.is_alive(), f"the small execution waited {took:.1f} s, for the slow one"
    slow.join(120)
    assert answer["r"].status_code == 200, answer["r"].text


def test_queues_are_bounded_and_say_when_to_retry(tmp_path):
    with Server(tmp_path / "plans.sqlite", workers_per_device=1,
                max_queued_executions=1) as server:
        first = in_thread(lambda: heavy_request(server.url, links=HELD_LINKS))
        wait_until_executing(server.url)
        # two more while it runs: one waits for the worker, the other is refused (which is
        # which depends on whose planning ends first: each plans its own definition)
        second = in_thread(lambda: heavy_request(server.url))
        third = heavy_request(server.url)
        second[0].join(120)
        answers = sorted([second[1]["r"], third], key=lambda r: r.status_code)
        assert [r.status_code for r in answers] == [200, 503], [r.text for r in answers]
        assert_problem(answers[1], 503, "waiting")
        assert int(answers[1].headers["retry-after"]) >= 1
        first[0].join(120)
        assert first[1]["r"].status_code == 200, first[1]["r"].text
    with Server(tmp_path / "per-client.sqlite", max_requests_per_client=1) as server:
        thread, answer = in_thread(lambda: heavy_request(server.url, links=HELD_LINKS))
        wait_until_executing(server.url)
        refused = heavy_request(server.url)
        assert_problem(refused, 429, "this client")
        assert int(refused.headers["retry-after"]) >= 1
        for k in range(3):  # no key is configured: a made-up one names no new client
            refused = heavy_request(server.url, {"authorization": f"Bearer made-up-{k}"})
            assert_problem(refused, 429, "this client")
        assert thread.is_alive()  # (all of it while the first one ran)
        thread.join(120)
        assert answer["r"].status_code == 200
