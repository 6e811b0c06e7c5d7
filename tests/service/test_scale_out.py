"""Scaling out (issue 20) and the cache's failures (issue 19, items 7, 9 and 12; issue 32,
defect 1: executions never fail because the cache cannot hand a plan back), run for real:
several ``fusecut serve`` replicas sharing one PostgreSQL (Debian's package, started here), a
server whose SQLite file fills its disk or is corrupt, and workers per device (``--gpus``) on
the CPU path: routing, a killed worker, bounded queues."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import torch

from fusecut.service.processes.worker_pool import parse_gpus, slot_names
from fusecut.wire.tensors import dump_safetensors
from tests.postgres import Postgres, require_binaries
from tests.server import Server
from tests.service.test_service import (
    SMALL,
    SMALL_FUSION,
    count,
    metric_samples,
    small_args,
    small_metas,
)
from tests.service.workloads import kserve_body

OCTETS = {"content-type": "application/octet-stream"}


def plan_body(rows: int, cols: int = 8, **options) -> dict:
    return {"definition": SMALL, "inputs": small_metas(rows, cols),
            **({"options": options} if options else {})}


def small_tensors(rows: int, cols: int = 8) -> bytes:
    """The safetensors body of SMALL's inputs (the plan of ``plan_body(rows, cols)``)."""
    a, b, c = small_args(rows, cols)
    return dump_safetensors(dict(zip(SMALL_FUSION.inputs,
                                     [a, b, torch.tensor(c, dtype=torch.float64)])))


def assert_executes(url: str, plan_id: str | None = None, rows: int = 4) -> None:
    """An execution by definition (KServe JSON) and, given a plan id, one by id."""
    ran = httpx.post(f"{url}/v1/execute", json=kserve_body([rows, 1, 2]), timeout=60)
    assert ran.status_code == 200, ran.text
    assert ran.json()["outputs"][0]["data"] == [-rows, -1, -2]
    if plan_id is not None:
        ran = httpx.post(f"{url}/v1/plans/{plan_id}/execute", content=small_tensors(rows),
                         headers=OCTETS, timeout=60)
        assert ran.status_code == 200, ran.text


def start_all(servers: list[Server]) -> list[Server]:
    for s in servers:
        s.launch()
    for s in servers:
        s.wait_ready(120)
    return servers


def ready(url: str) -> dict:
    return httpx.get(f"{url}/readyz", timeout=10).json()


async def post_together(urls: list[str], body: dict) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(client.post(f"{u}/v1/plan", json=body) for u in urls))


@pytest.fixture(scope="module")
def replicas(postgres, tmp_path_factory):
    """Three replicas sharing one PostgreSQL database."""
    url = postgres.create_database("replicas")
    root = tmp_path_factory.mktemp("replicas")
    servers = start_all([Server(root / f"unused-{i}.sqlite", cache_url=url, worker=0)
                         for i in range(3)])  # executions in-process: fewer processes to start
    yield servers
    for s in servers:
        s.stop()


def test_a_plan_made_on_one_replica_is_a_hit_on_the_others(replicas):
    a, b, c = (s.url for s in replicas)
    assert all(ready(u)["cache"]["backend"] == "postgresql" for u in (a, b, c))
    made = httpx.post(f"{a}/v1/plan", json=plan_body(3), timeout=60)
    assert made.status_code == 200 and made.headers["x-fusecut-cache"] == "miss"
    plan = made.json()
    for other in (b, c):
        fetched = httpx.get(f"{other}/v1/plans/{plan['plan_id']}", timeout=30)
        assert fetched.status_code == 200 and fetched.json() == plan  # by id
        again = httpx.post(f"{other}/v1/plan", json=plan_body(3), timeout=60)
        assert again.headers["x-fusecut-cache"] == "hit" and again.json() == plan  # by body
    # the same request written differently: parsed, then found by its plan id
    reordered = {"inputs": small_metas(3, 8), "definition": SMALL + "\n# another text\n"}
    found = httpx.post(f"{c}/v1/plan", json=reordered, timeout=60)
    assert found.headers["x-fusecut-cache"] == "hit" and found.json() == plan
    # an execution on a third replica, by the id of a plan made on the first (CPU path)
    args = small_args(3, 8)
    tensors = dump_safetensors({"T0": args[0], "T1": args[1],
                                "S2": __import__("torch").tensor(args[2])})
    executed = httpx.post(f"{c}/v1/execute", content=tensors, timeout=120, headers={
        "content-type": "application/octet-stream", "x-fusecut-plan-id": plan["plan_id"]})
    assert executed.status_code == 200, executed.text
    assert executed.headers["x-fusecut-plan-id"] == plan["plan_id"]


def test_concurrent_identical_plans_are_computed_once_per_replica(replicas):
    urls = [s.url for s in replicas]
    before = [metric_samples(httpx.get(f"{u}/metrics").text) for u in urls]
    body = plan_body(5, 9, seed=11)
    # four identical requests at each replica, all at once
    responses = asyncio.run(post_together([u for u in urls for _ in range(4)], body))
    assert all(r.status_code == 200 for r in responses)
    bodies = {r.content for r in responses}
    plan_id = responses[0].json()["plan_id"]
    after = [metric_samples(httpx.get(f"{u}/metrics").text) for u in urls]
    misses = [count(x, "fusecut_plans_total", cache="miss") -
              count(y, "fusecut_plans_total", cache="miss") for x, y in zip(after, before)]
    assert all(m <= 1 for m in misses) and 1 <= sum(misses) <= 3  # single-flight per process
    # every replica serves the one stored copy from now on
    stored = {httpx.get(f"{u}/v1/plans/{plan_id}").content for u in urls}
    assert len(stored) == 1 and stored <= bodies
    again = asyncio.run(post_together(urls, body))  # a replica that lost the race adopted it
    assert {r.content for r in again} == stored
    import psycopg

    with psycopg.connect(ready(urls[0])["cache"]["location"]) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM plans WHERE plan_id = %s",
                            (plan_id,)).fetchone()[0]
    assert rows == 1


def test_postgresql_stopped_mid_run_and_restarted(tmp_path):
    server = Postgres(require_binaries()).start()
    try:
        url = server.create_database("restart")
        a, b = start_all([Server(tmp_path / f"r{i}.sqlite", cache_url=url, worker=0)
                          for i in range(2)])
        try:
            first = httpx.post(f"{a.url}/v1/plan", json=plan_body(2), timeout=60).json()
            server.stop()  # mid-run
            for i, replica in enumerate((a, b)):
                made = httpx.post(f"{replica.url}/v1/plan", json=plan_body(10 + i), timeout=60)
                assert made.status_code == 200 and made.headers["x-fusecut-cache"] == "miss"
            hit = httpx.post(f"{a.url}/v1/plan", json=plan_body(2), timeout=60)
            assert hit.status_code == 200 and hit.json() == first  # from memory
            # issue 32, defect 1: executions were 404s (6/6) while /v1/plan worked
            for i, replica in enumerate((a, b)):
                made = httpx.post(f"{replica.url}/v1/plan", json=plan_body(30 + i), timeout=60)
                for _ in range(3):
                    assert_executes(replica.url, made.json()["plan_id"], rows=30 + i)
            state = ready(a.url)
            assert state["status"] == "degraded" and state["cache"]["state"] == "degraded"
            assert state["cache"]["error"]
            samples = metric_samples(httpx.get(f"{a.url}/metrics").text)
            assert count(samples, "fusecut_cache_errors_total") >= 1
            assert samples[("fusecut_cache_degraded", ())] == 1
            assert httpx.get(f"{b.url}/v1/plans/{first['plan_id']}").status_code == 404
            server.start()
            deadline = time.monotonic() + 60
            while ready(b.url)["status"] != "ready" or ready(a.url)["status"] != "ready":
                assert time.monotonic() < deadline, (ready(a.url), ready(b.url))
                time.sleep(0.5)
            again = httpx.post(f"{a.url}/v1/plan", json=plan_body(20), timeout=60).json()
            shared = httpx.post(f"{b.url}/v1/plan", json=plan_body(20), timeout=60)
            assert shared.headers["x-fusecut-cache"] == "hit" and shared.json() == again
            assert httpx.get(f"{b.url}/v1/plans/{first['plan_id']}").json() == first
        finally:
            a.stop()
            b.stop()
    finally:
        server.close()


# ---- SQLite failures, through the service ---------------------------------------------------


def small_disk(mount: Path) -> list[str]:
    """A command prefix that runs the server with a 512 KiB tmpfs at ``mount``, in a mount
    namespace of its own (nothing is left mounted)."""
    mount.mkdir()
    prefix = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    probe = subprocess.run([*prefix, "sh", "-c", f"mount -t tmpfs -o size=1k tmpfs {mount}"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or shutil.which("unshare") is None:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a small tmpfs in a mount namespace: {probe.stderr}")
        pytest.skip(f"cannot mount a small tmpfs here (root or user namespaces needed): "
                    f"{probe.stderr.strip()}")
    return [*prefix, "sh", "-c", f'mount -t tmpfs -o size=512k tmpfs {mount} && exec "$@"', "sh"]


def test_a_full_disk_still_returns_plans_and_readyz_says_degraded(tmp_path):
    # issue 19 item 7: new plans gave 500 on a full disk while /readyz stayed 200 "ready"
    disk = tmp_path / "disk"
    with Server(disk / "plans.sqlite", wrap=small_disk(disk)) as s:
        made = []
        # each plan stores ~6 KB of plan and request, and SQLite's write-ahead log grows
        # until a checkpoint, which runs when it can: how many plans fill 512 KiB varies, so
        # plan until the cache says so (400 plans hold 2.4 MB, far past the disk)
        for rows in range(1, 400):
            r = httpx.post(f"{s.url}/v1/plan", json=plan_body(rows, 64), timeout=60)
            assert r.status_code == 200, r.text
            made.append(r.json())
            if rows % 10 == 0 and ready(s.url)["status"] == "degraded":
                break
        state = ready(s.url)
        assert state["status"] == "degraded" and "full" in state["cache"]["error"]
        samples = metric_samples(httpx.get(f"{s.url}/metrics").text)
        assert count(samples, "fusecut_cache_errors_total", operation="put") >= 1
        assert httpx.post(f"{s.url}/v1/plan", json=plan_body(1, 64)).json() == made[0]


def test_a_corrupt_cache_file_is_moved_aside_at_startup(tmp_path):
    # issue 19 item 9: a bad header killed start-up with a 127-line traceback
    path = tmp_path / "plans.sqlite"
    path.write_bytes(b"not an sqlite file" * 300)
    with Server(path) as s:
        assert httpx.post(f"{s.url}/v1/plan", json=plan_body(4)).status_code == 200
        state = ready(s.url)
        [moved] = state["cache"]["quarantined"]
        assert state["status"] == "ready" and Path(moved).read_bytes().startswith(b"not an")
        samples = metric_samples(httpx.get(f"{s.url}/metrics").text)
        assert samples[("fusecut_cache_quarantined_total", ())] == 1
    log = s.log.read_text()
    assert "Traceback" not in log
    [line] = [x for x in log.splitlines() if "corrupt" in x]
    assert str(path) in line and moved in line


def test_the_cache_bound_holds_through_the_service(tmp_path):
    # issue 19 item 12: the cache never evicted; any client could grow it by varying the seed
    bound = 60_000
    with Server(tmp_path / "plans.sqlite", cache_max_bytes=bound) as s:
        for seed in range(30):
            r = httpx.post(f"{s.url}/v1/plan", json=plan_body(4, seed=seed), timeout=60)
            assert r.status_code == 200
        state = ready(s.url)["cache"]
        samples = metric_samples(httpx.get(f"{s.url}/metrics").text)
    assert state["bytes"] <= bound and state["evicted"] >= 1
    assert state["plans"] < 30 and samples[("fusecut_cache_evictions_total", ())] >= 1


def test_executions_need_no_cache_to_hand_plans_back(tmp_path):
    # issue 32, defect 1: a plan the cache did not keep (here: larger than half its bound,
    # served, never stored) could not be executed, by id or by definition: 404 "unknown plan"
    with Server(tmp_path / "kept.sqlite", cache_max_bytes=2000, worker=0) as s:
        made = httpx.post(f"{s.url}/v1/plan", json=plan_body(4), timeout=60)
        assert made.status_code == 200 and ready(s.url)["cache"]["plans"] == 0
        for _ in range(2):
            assert_executes(s.url, made.json()["plan_id"])
    # nothing in memory either: a definition is planned again, an id is unknown
    with Server(tmp_path / "none.sqlite", cache_max_bytes=2000, cache_memory_items=0,
                worker=0) as s:
        for _ in range(2):
            assert_executes(s.url)
        made = httpx.post(f"{s.url}/v1/plan", json=plan_body(4), timeout=60).json()
        gone = httpx.post(f"{s.url}/v1/plans/{made['plan_id']}/execute", headers=OCTETS,
                          content=small_tensors(4), timeout=60)
        assert gone.status_code == 404 and made["plan_id"] in gone.json()["detail"]


def test_a_worker_remembers_only_the_plans_it_holds():
    # issue 32, defect 1: the service's record of the plans a worker holds was never pruned
    from fusecut.service.processes.worker import PLANS_HELD, Worker

    worker = Worker()
    for k in range(PLANS_HELD * 3):
        worker._remember(f"{k:032x}")
    assert len(worker._known) == PLANS_HELD
    assert worker.knows(f"{PLANS_HELD * 3 - 1:032x}") and not worker.knows(f"{0:032x}")
    worker._remember(f"{PLANS_HELD * 2:032x}")  # used again: kept longest
    worker._remember("f" * 32)
    assert worker.knows(f"{PLANS_HELD * 2:032x}")


# ---- a worker per device ----------------------------------------------------------------------


def test_gpus_lists_devices():
    assert parse_gpus(None) is None and parse_gpus("") is None
    assert parse_gpus("0,1", visible="") == ["0", "1"]
    assert parse_gpus("0,0") == ["0", "0"] or os.environ.get("CUDA_VISIBLE_DEVICES")
    assert parse_gpus("1", visible="4,5") == ["5"]  # indices of the visible devices
    assert parse_gpus("all", count=2, visible="") == ["0", "1"]
    assert parse_gpus("all", count=2, visible="6,7") == ["6", "7"]
    assert parse_gpus("all", count=0, visible="") is None  # no GPU: the one default worker
    with pytest.raises(ValueError, match="'x'"):
        parse_gpus("0,x")
    with pytest.raises(ValueError, match="only 2 devices"):
        parse_gpus("2", visible="0,1")
    assert slot_names(["0", "1", "0", "0"]) == ["0", "1", "0/2", "0/3"]


SLOW = """
def fusion(fd):
    T0 = fd.define_tensor(shape=[1, 1], contiguity=[True, True], dtype=DataType.Float)
    T1 = fd.ops.broadcast_in_dim(T0, shape=[N, N], broadcast_dims=[0, 1])
    T2 = fd.ops.exp(T1)
    T3 = fd.ops.sin(T2)
    T4 = fd.ops.cos(T3)
    T5 = fd.ops.tanh(T4)
    T6 = fd.ops.sum(T5, dims=[1], keepdim=False)
    fd.add_output(T6)
"""


def execute_slow(url: str, n: int = 3072) -> httpx.Response:
    """An execution of ~0.3 s of CPU at n = 3072 whose request and response are small."""
    import torch

    tensors = dump_safetensors({"T0": torch.ones(1, 1)})
    return httpx.post(f"{url}/v1/execute", timeout=120,
                      data={"definition": SLOW.replace("N", str(n))},
                      files={"tensors": ("t.safetensors", tensors)})


async def execute_together(url: str, k: int, n: int = 3072) -> list[httpx.Response]:
    return await asyncio.gather(*(asyncio.to_thread(execute_slow, url, n) for _ in range(k)))


def two_devices() -> str:
    """Two workers: on two GPUs where there are, else both on GPU 0, else on the CPU path."""
    import torch

    return "0,1" if torch.cuda.device_count() >= 2 else "0,0"


def all_up(url: str, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        workers = ready(url)["workers"]
        if all(w["up"] for w in workers):
            return workers
        assert time.monotonic() < deadline, workers
        time.sleep(0.3)


def test_two_workers_share_executions_and_survive_one_killed(tmp_path):
    devices = two_devices()
    with Server(tmp_path / "plans.sqlite", gpus=devices, workers_per_device=1) as s:
        workers = all_up(s.url)  # /readyz is 200 once any worker is up
        assert [w["device"] for w in workers] == slot_names(devices.split(","))
        assert execute_slow(s.url, 8).status_code == 200  # warm the paths
        responses = asyncio.run(execute_together(s.url, 4, 1024))
        assert all(r.status_code == 200 for r in responses)
        busy = [w["executions"] for w in ready(s.url)["workers"]]
        assert min(busy) >= 1 and sum(busy) == 5  # least loaded: both took some
        samples = metric_samples(httpx.get(f"{s.url}/metrics").text)
        assert count(samples, "fusecut_device_executions_total") == 5
        assert count(samples, "fusecut_device_worker_up") == 2
        # kill one worker: the other serves every request while it restarts
        victim = ready(s.url)["workers"][0]
        os.kill(victim["pid"], 9)
        time.sleep(0.2)
        for _ in range(4):
            assert execute_slow(s.url, 64).status_code == 200
        deadline = time.monotonic() + 60
        while True:
            first = ready(s.url)["workers"][0]
            if first["up"] and first["pid"] != victim["pid"]:
                break
            assert time.monotonic() < deadline, first
            time.sleep(0.3)
        assert first["restarts"] == 1


def test_full_queues_answer_503_with_retry_after(tmp_path):
    # two run, one waits (max_queued_executions counts waiting for all workers together)
    with Server(tmp_path / "plans.sqlite", gpus=two_devices(), workers_per_device=1,
                max_queued_executions=1) as s:
        all_up(s.url)
        assert execute_slow(s.url).status_code == 200  # planned once: the rest only run
        responses = asyncio.run(execute_together(s.url, 6))
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) >= 2 and 503 in codes, codes
        busy = next(r for r in responses if r.status_code == 503)
        assert int(busy.headers["retry-after"]) >= 1
        assert busy.json()["title"] == "busy" and "retry" in busy.json()["detail"]
        assert execute_slow(s.url, 8).status_code == 200  # the queues drain



def test_workers_per_device_multiply_the_listed_devices():
    # the merge of harden (2 workers by default) and scale (a worker per --gpus device)
    from fusecut.service.processes.worker_pool import WorkerPool

    pool = WorkerPool(["0", "1"], process=True, per_device=2)
    assert [s.name for s in pool.slots] == ["0", "0/2", "1", "1/2"] and len(pool) == 4
    assert [s.worker.env for s in pool.slots] == [{"CUDA_VISIBLE_DEVICES": d}
                                                  for d in ("0", "0", "1", "1")]
    default = WorkerPool(None, process=True, per_device=2)
    assert [s.name for s in default.slots] == ["default", "default/2"]
    assert all(s.worker.env == {} for s in default.slots)  # whatever the service sees
