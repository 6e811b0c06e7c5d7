"""The service's worker and planner processes die with it, killed or stopped, and a clean stop
leaks nothing.

From the hostile-input review of issue 19 (defect 8).
"""

from __future__ import annotations

import os
import signal

from tests.server import Server
from tests.service.probes import alive, readyz, wait_for, workers_up


def test_children_die_with_the_service_and_a_clean_stop_leaks_nothing(tmp_path):
    for how in (signal.SIGKILL, signal.SIGTERM):
        with Server(tmp_path / f"plans-{how.name}.sqlite") as server:  # stopped on a failure
            wait_for(lambda server=server: readyz(server.url)["planner_pids"], 60, "no planner")
            state = workers_up(server.url)
            children = [w["pid"] for w in state["workers"]] + state["planner_pids"]
            assert len(children) >= 3 and all(map(alive, children))
            if how is signal.SIGKILL:
                server.proc.kill()
                server.proc.wait(10)
                server.proc = None
            else:
                server.stop()
                log = server.log.read_text()
                assert "leaked" not in log and "Traceback" not in log, log[-2000:]
            try:
                wait_for(lambda children=children: not any(map(alive, children)), 5,
                         f"children outlived the service after {how.name}: "
                         f"{[p for p in children if alive(p)]}")
            finally:
                for pid in filter(alive, children):  # leave no orphan behind a failure
                    os.kill(pid, signal.SIGKILL)
