"""The engine (``fusecut.engine``): one staged road from definition to kernels, its caches
bounded and shared by every door of the process (issue 46)."""

from __future__ import annotations

import json
import os

import pytest
import torch

import fusecut.engine
from fusecut import FusionDefinition
from fusecut.engine import Engine, default_engine
from fusecut.optimizer.ir.nvtext import parse_text
from fusecut.optimizer.ir.wire import fusion_to_json
from fusecut.plan import PlanView
from fusecut.service.processes.worker import Job, Worker


def _definition(scale: float) -> FusionDefinition:
    """A small softmax-like definition; ``scale`` makes each test's fusion its own."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True])
        m = fd.ops.max(x, dims=[1], keepdim=True)
        e = fd.ops.exp(fd.ops.mul(fd.ops.sub(x, m), fd.define_scalar(scale)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True)))
    return fd


def _refuse_planning(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("planned again: the engine should have served the plan")

    monkeypatch.setattr(fusecut.engine, "make_plan", refuse)


def test_plans_and_programs_are_bounded_least_recently_used_out():
    engine = Engine(max_plans=2, max_programs=2)
    handle = engine.fusion(_definition(1.5).fusion)
    shapes = [(4, 8), (4, 16), (4, 32)]
    plans = [handle.plan([torch.randn(s)]) for s in shapes]
    assert len(engine.plans) == 2 and engine.stats.plans_made == 3
    assert handle.plan([torch.randn(shapes[2])]) is plans[2]  # kept: a hit
    assert engine.stats.plan_hits == 1
    handle.plan([torch.randn(shapes[0])])  # dropped first: planned again
    assert engine.stats.plans_made == 4
    with pytest.raises(ValueError, match="room for one entry"):
        Engine(max_plans=0)


def test_a_plan_one_door_made_is_served_to_another(monkeypatch):
    # the SDK plans; the CLI's door (a definition parsed from repro text: another Fusion object
    # of the same content) is served the same plan without planning
    fd = _definition(1.25)
    x = torch.randn(8, 32)
    made = fd.plan([x]).plan
    _refuse_planning(monkeypatch)
    text = fd.repro_script_for()
    parsed = parse_text(text.split("with FusionDefinition()")[0]).fusion
    assert parsed is not fd.fusion
    assert default_engine().fusion(parsed).plan([x]) is made


def test_the_worker_is_served_the_sdks_plan_and_the_sdk_the_workers(monkeypatch):
    x = torch.randn(8, 32)
    # SDK first: the service's worker (inline, as in the service's own process) runs it
    fd = _definition(1.75)
    view = fd.plan([x])
    request = json.dumps({"definition": fusion_to_json(fd.handle.fusion),
                          "inputs": [{"shape": [8, 32], "dtype": "float32"}]})
    source = (request, json.dumps(view.json))
    adopted = default_engine().stats.plans_adopted
    worker = Worker(process=False)
    worker.start()
    name = fd.handle.fusion.inputs[0]
    outcome = worker.execute(Job(view.plan_id, {name: x}), lambda: source, timeout=60)
    assert outcome.plan_id == view.plan_id, outcome
    assert default_engine().stats.plans_adopted == adopted  # the SDK's plan, not rebuilt
    torch.testing.assert_close(dict(outcome.outputs)[fd.handle.fusion.outputs[0]],
                               torch.softmax(x * 1.75, dim=1))
    # the worker first (a plan the service made, restored): the SDK asking for it is served it
    other = _definition(2.25)
    planned = fusecut.engine.make_plan(other.fusion, fusecut.engine.as_metadata([x]),
                                       fusecut.engine.PlanOptions())
    request = json.dumps({"definition": fusion_to_json(other.fusion),
                          "inputs": [{"shape": [8, 32], "dtype": "float32"}]})
    texts = (request, json.dumps(PlanView(plan=planned).json))
    outcome = worker.execute(Job(planned.plan_id, {other.fusion.inputs[0]: x}), lambda: texts,
                             timeout=60)
    assert outcome.plan_id == planned.plan_id, outcome
    assert default_engine().stats.plans_adopted == adopted + 1
    _refuse_planning(monkeypatch)
    assert other.plan([x]).plan_id == planned.plan_id
    worker.stop()


def test_in_process_plans_render_their_json_only_when_read(monkeypatch):
    calls = []
    fd = _definition(3.0)
    x = torch.randn(4, 8)
    plan = fd.handle.plan([x])
    real = type(plan).to_json
    monkeypatch.setattr(type(plan), "to_json", lambda self: calls.append(1) or real(self))
    fd.execute([x])
    view = fd.plan([x])
    assert calls == []  # planned and run: nothing rendered
    assert view.segments and calls == [1]
    assert view.json is view.json and calls == [1]  # rendered once


def test_a_second_process_restores_the_plans_the_first_made(tmp_path):
    # issue 42, a warm first step: plans are kept in the cache folder and the same script's
    # next process restores them (no planning), the plan identical
    import subprocess
    import sys

    script = """
import json, sys, torch
import fusecut.engine
from fusecut import FusionDefinition
from fusecut.runtime import plan_files
with FusionDefinition() as fd:
    x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True])
    fd.add_output(fd.ops.div(x, fd.ops.sum(x, dims=[1], keepdim=True)))
plan = fd.plan([torch.randn(16, 64)]).plan
plan_files.flush()
print(json.dumps([plan.plan_id, fusecut.engine.default_engine().stats.plans_made,
                  fusecut.engine.default_engine().stats.plans_loaded]))
"""
    env = {**os.environ, "FUSECUT_PLANS_ON_DISK": "true", "FUSECUT_CACHE_DIR": str(tmp_path)}

    def run():
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first[1:] == [1, 0] and second[1:] == [0, 1], (first, second)
    assert first[0] == second[0]
    assert len(list((tmp_path / "plans").rglob("*.json"))) == 1
    env["FUSECUT_PLANS_ON_DISK"] = "false"
    assert run()[1:] == [1, 0]  # off: planned again


def test_a_damaged_plan_file_is_planned_again(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSECUT_PLANS_ON_DISK", "true")
    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    fd = _definition(4.5)
    x = torch.randn(4, 24)
    handle = Engine().fusion(fd.fusion)
    where = fusecut.engine.plan_files.plan_file(handle.id, fusecut.engine.as_metadata([x]),
                                                 fusecut.engine.options_key({}))
    where.parent.mkdir(parents=True)
    where.write_text("{not json")
    plan = handle.plan([x])
    assert handle.engine.stats.plans_made == 1 and handle.engine.stats.plans_loaded == 0
    fusecut.engine.plan_files.flush()
    assert json.loads(where.read_text())["plan_id"] == plan.plan_id  # written over, whole
