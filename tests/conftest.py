"""Shared fixtures: the corpus, small inputs, and the GPU marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

CORPUS = Path(__file__).parent / "corpus"
CORPUS_FILES = sorted(CORPUS.glob("*.py"))
HAS_GPU = torch.cuda.is_available()

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("gpu", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Plans kept on disk would carry one test's plans into another (a test that counts planning, or
# injects a planning failure, would be served a plan instead): off for the suite and the
# processes it starts; tests/test_engine.py turns them on in a folder of its own.
os.environ["FUSECUT_PLANS_ON_DISK"] = "false"


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def same_random_tensors_in_any_order():
    """Each test starts torch's generators from one seed, so it draws the same tensors alone as
    in the whole suite: left as the test before left them, a tolerance could hold in one order
    and fail in another (CI once failed a bf16 step on one draw of weights in 30)."""
    torch.manual_seed(0)


@pytest.fixture(params=CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def corpus_file(request) -> Path:
    return request.param


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real fusecut service (uvicorn on loopback, its own SQLite file) for one test module."""
    from tests.server import Server

    with Server(tmp_path_factory.mktemp("svc") / "plans.sqlite") as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server (Debian's package) for the whole run; tests make their own
    databases (``postgres.create_database``). A test that stops the server makes its own."""
    from tests.postgres import Postgres, require_binaries

    server = Postgres(require_binaries()).start()
    yield server
    server.close()
