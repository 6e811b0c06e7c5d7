"""Compiling ahead (``runtime.ahead``) and the single-flight compile cache it relies on. NVRTC
needs no GPU: these run on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from fusecut.codegen import generate_segment
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import make_plan
from fusecut.runtime import ahead
from fusecut.runtime import compile as rc
from fusecut.runtime.lru import BoundedCache
from tests.helpers import fusion, record_nvrtc_threads

SOURCE = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'


@pytest.fixture
def empty_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rc, "_memory", BoundedCache(rc.MAX_CUBINS))


@pytest.fixture
def nvrtc_calls(monkeypatch):
    return record_nvrtc_threads(monkeypatch)


def test_callers_of_a_source_being_compiled_wait_for_that_compile(empty_caches, monkeypatch):
    calls = []

    def slow_nvrtc(source, arch, name):
        calls.append(name)
        time.sleep(0.3)  # the other callers arrive while this one compiles
        return b"cubin"

    monkeypatch.setattr(rc, "_nvrtc", slow_nvrtc)
    results = []
    threads = [threading.Thread(target=lambda: results.append(rc.compile_cubin(SOURCE, "sm_90")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [b"cubin"] * 4
    assert len(calls) == 1
    assert not rc._in_flight


def test_a_failed_compile_leaves_the_waiters_to_compile_for_themselves(empty_caches,
                                                                       monkeypatch):
    attempts = []

    def fails_first(source, arch, name):
        attempts.append(name)
        time.sleep(0.2)
        if len(attempts) == 1:
            raise rc.CompileError("injected")
        return b"cubin"

    monkeypatch.setattr(rc, "_nvrtc", fails_first)
    outcomes = []

    def call():
        try:
            outcomes.append(rc.compile_cubin(SOURCE, "sm_90"))
        except rc.CompileError as e:
            outcomes.append(str(e))

    first = threading.Thread(target=call)
    first.start()
    time.sleep(0.05)
    second = threading.Thread(target=call)
    second.start()
    first.join()
    second.join()
    assert outcomes == ["injected", b"cubin"]
    assert len(attempts) == 2
    assert not rc._in_flight


def small_plan():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.exp(T0)
T3 = fd.ops.mul(T2, T1)
T4 = fd.ops.sum(T3, dims=[1], keepdim=False)
fd.add_output(T3)
fd.add_output(T4)
""")
    return make_plan(f, [tensor_meta((64, 256), DType.float32)] * 2)


def test_a_plan_compiled_ahead_is_what_its_launch_finds(empty_caches, nvrtc_calls):
    plan = small_plan()
    ahead.submit(lambda: ahead.compile_plan(plan, "sm_90"))
    ahead.wait()
    assert nvrtc_calls and all(n.startswith("fusecut-ahead-") for n in nvrtc_calls)
    compiled = len(nvrtc_calls)
    hits = rc.STATS.memory_hits
    generated = [generate_segment(plan, s, None) for s in plan.segments
                 if s.kind not in ahead.NOT_GENERATED]
    for kernels in generated:  # what segment_code compiles at the first launch
        rc.compile_cubin(kernels.source, "sm_90", kernels.kernels[0].name)
    assert len(nvrtc_calls) == compiled  # all found in memory
    assert rc.STATS.memory_hits == hits + len(generated) == hits + compiled


def test_a_failing_job_is_dropped_and_the_workers_go_on():
    done = []

    def fails():
        raise RuntimeError("injected")

    for _ in range(ahead.worker_count() + 1):
        ahead.submit(fails)
    ahead.submit(lambda: done.append(threading.current_thread().name))
    ahead.wait()
    assert len(done) == 1 and done[0].startswith("fusecut-ahead-")
    assert all(t.is_alive() and t.daemon for t in ahead._workers)


def test_compiling_ahead_can_be_turned_off(monkeypatch):
    assert ahead.enabled()
    monkeypatch.setenv(ahead.ENV, "0")
    assert not ahead.enabled()


def test_threads_compiling_at_once_in_a_fresh_process_all_succeed(tmp_path):
    # cuda.core chooses its CUDA-version module while it is imported: threads that imported it at
    # once were handed it half made on the H100 (ImportError from cuda.core.cu13), and every
    # region of a first step fell back to torch
    script = (
        "import threading\n"
        "from fusecut.runtime.compile import compile_cubin\n"
        "errors = []\n"
        "def one(i):\n"
        "    try:\n"
        "        compile_cubin(f'extern \"C\" __global__ void k{i}(float* x) {{ x[0] = {i}; }}',"
        " 'sm_90', f'k{i}')\n"
        "    except Exception as e:\n"
        "        errors.append(repr(e))\n"
        "threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(errors)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "FUSECUT_CACHE_DIR": str(tmp_path),
                                            "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    assert len(list(tmp_path.glob("*.cubin"))) == 8
