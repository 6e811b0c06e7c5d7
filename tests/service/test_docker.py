"""The docker/ deployment agrees with the code: images copy every package and start the real CLI,
compose wires Prometheus to the service, and the Grafana dashboard asks only for metrics (and
labels) the service exports. Docker itself is not needed to check this."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import typer.main
import yaml
from prometheus_client.metrics import MetricWrapperBase

from fusecut.cli import app as cli_app
from fusecut.service import metrics

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def dockerfile_stages() -> dict[str, list[str]]:
    """Instructions (continuation lines joined) of each named stage of docker/Dockerfile."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            current = line.split()[-1]
            stages[current] = []
        elif line and not line.startswith("#") and current is not None:
            stages[current].append(line)
    return stages


def exported_metrics() -> dict[str, tuple[str, ...]]:
    """Sample names the service can export, each with its labels."""
    names: dict[str, tuple[str, ...]] = {}
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        labels = tuple(value._labelnames)
        base = value._name
        if value._type == "counter":
            names[base + "_total"] = labels
        elif value._type == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[base + suffix] = labels + (("le",) if suffix == "_bucket" else ())
        else:
            names[base] = labels
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "fusecut.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_dashboard_asks_only_for_exported_metrics_and_labels():
    exported = exported_metrics()
    queries = dashboard_queries()
    used = set()
    for expr in queries:
        names = set(re.findall(r"\bfusecut_[a-z_]+", expr))
        assert names, f"a panel queries no fusecut metric: {expr}"
        unknown = names - set(exported)
        assert not unknown, f"{expr} asks for metrics the service does not export: {unknown}"
        labels = set().union(*(exported[n] for n in names))
        grouped = {g.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for g in by.split(",")}
        matched = set(re.findall(r"[{,]\s*([a-z_]+)\s*=", expr))
        assert grouped | matched <= labels, f"{expr} uses labels {grouped | matched - labels}"
        used |= names
    # every family shows up somewhere on the dashboard
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert families <= shown, f"metrics missing from the dashboard: {families - shown}"


def test_images_copy_every_package_and_start_the_cli():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # the rooms of the one package, and setup.py (it lists the packages and ships the .pth)
    sources = {*pyproject["tool"]["setuptools"]["package-dir"].values(), "setup.py"}
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    serve = typer.main.get_command(cli_app).commands["serve"]
    stages = dockerfile_stages()
    assert {"sources", "base-cpu", "base-gpu", "fusecut"} <= set(stages)
    assert "FROM base-${VARIANT} AS fusecut" in (DOCKER / "Dockerfile").read_text()
    copied = {word for line in stages["sources"] if line.startswith("COPY ")
              for word in line.split()[1:-1]}
    assert sources | {"pyproject.toml"} <= copied, f"the images miss {sources - copied}"
    assert all(f"!{s}" in ignore for s in sources | {"pyproject.toml"})
    final = stages["fusecut"]  # both variants end in this stage
    assert "COPY --from=sources /sources ./" in final
    cmd = json.loads(next(line for line in final if line.startswith("CMD "))[4:])
    assert cmd[0] == "fusecut"
    context = serve.make_context("serve", cmd[2:])  # a bad option raises here
    assert cmd[1] == "serve" and context.params["port"] == 8000
    env = " ".join(line for line in final if line.startswith("ENV "))
    assert "FUSECUT_DB_PATH=/data/" in env  # the plan cache lives on the volume


REPLICAS = ["fusecut", "fusecut-2"]


def test_compose_wires_prometheus_and_grafana_to_the_service():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    gpu = yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())
    service = compose["services"]["fusecut"]
    stages = dockerfile_stages()
    variants = [service["build"]["args"]["VARIANT"],
                *(gpu["services"][r]["build"]["args"]["VARIANT"] for r in REPLICAS)]
    assert variants == ["cpu", "gpu", "gpu"] and all(f"base-{v}" in stages for v in variants)
    assert (ROOT / service["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    published = [p.rsplit(":", 1)[1] for p in service["ports"]]  # the container's port
    assert all(p.startswith("127.0.0.1:") for s in compose["services"].values()
               for p in s.get("ports", [])), "publish on the host's loopback only"
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"]
               for t in c["targets"]]
    assert targets == [f"{r}:{published[0]}" for r in REPLICAS]  # every replica scraped
    assert prometheus["scrape_configs"][0]["metrics_path"] == "/metrics"
    for mount in [*compose["services"]["grafana"]["volumes"],
                  *compose["services"]["prometheus"]["volumes"]]:
        source = mount.split(":")[0]
        assert (DOCKER / source).exists(), f"compose mounts {source}, which does not exist"
    provider = yaml.safe_load(
        (DOCKER / "grafana/provisioning/dashboards/fusecut.yaml").read_text())["providers"][0]
    dashboards_mount = next(m for m in compose["services"]["grafana"]["volumes"]
                            if "dashboards:" in m and "provisioning" not in m)
    assert dashboards_mount.split(":")[1] == provider["options"]["path"]
    datasource = yaml.safe_load(
        (DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    uids = {p["datasource"]["uid"] for p in json.loads(
        (DOCKER / "grafana/dashboards/fusecut.json").read_text())["panels"]}
    assert uids == {datasource["datasources"][0]["uid"]}


def test_empty_optional_settings_mean_unset(monkeypatch):
    from fusecut.service.settings import Settings

    monkeypatch.setenv("FUSECUT_API_KEY", "")  # compose passes ${FUSECUT_API_KEY:-}
    assert Settings.from_env().api_key is None
    monkeypatch.setenv("FUSECUT_MAX_OPS", "many")
    with pytest.raises(ValueError, match="FUSECUT_MAX_OPS must be a number"):
        Settings.from_env()


def test_compose_replicas_share_a_postgresql_cache():
    # issue 20: two replicas and a PostgreSQL service; a plan made on one is a hit on the other
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    database = services["postgres"]
    env = database["environment"]
    assert database["image"].startswith("postgres:") and "pg_isready" in database[
        "healthcheck"]["test"]
    for name in REPLICAS:
        replica = services[name]
        url = replica["environment"]["FUSECUT_CACHE_URL"]
        assert url.startswith(f"postgresql://{env['POSTGRES_USER']}:") and \
            url.endswith(f"@postgres:5432/{env['POSTGRES_DB']}")
        assert replica["depends_on"]["postgres"]["condition"] == "service_healthy"
    hosts = [services[r]["ports"][0].rsplit(":", 2)[1] for r in REPLICAS]
    assert len(set(hosts)) == len(REPLICAS)  # each replica on its own host port
    assert "postgres" in (DOCKER / "Dockerfile").read_text()  # the image has psycopg
    gpu = yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())["services"]
    assert all(gpu[r]["environment"]["FUSECUT_GPUS"] == "all" for r in REPLICAS)


# ---- issue 19: the images ---------------------------------------------------------------------

def makefile_torch() -> str:
    return re.search(r"torch==([0-9.]+)", (ROOT / "Makefile").read_text()).group(1)


def test_both_images_pin_the_torch_the_tests_run_against():
    stages = dockerfile_stages()
    text = (DOCKER / "Dockerfile").read_text()
    assert f"ARG TORCH_VERSION={makefile_torch()}" in text
    for stage in ("base-cpu", "base-gpu"):
        installs = [line for line in stages[stage] if "pip install" in line and "torch" in line]
        assert installs and all("torch==${TORCH_VERSION}" in line for line in installs), stage
        assert "ARG TORCH_VERSION" in stages[stage], stage


def test_the_cpu_image_leaves_out_cuda_python_and_runs_without_it():
    # cuda-python[all] pulled about 430 MB of nvidia/* wheels into the CPU image
    import subprocess
    import sys

    # (issue 32: and so did every CPU install): the gpu extra brings it, the CPU image leaves
    # it out
    final = " ".join(dockerfile_stages()["fusecut"])
    assert 'if [ "$VARIANT" = cpu ]; then pip install ".[postgres]" ;' in final
    assert 'else pip install ".[gpu,postgres]" ; fi' in final
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("cuda")]
    assert project["optional-dependencies"]["gpu"] == ["cuda-python[all]>=12.6"]
    # the CPU path (planning, the worker's runner, the service) never imports cuda
    probe = """
import sys
sys.modules["cuda"] = None  # import cuda fails, as in the CPU image
import json
from fusecut import load
from fusecut.optimizer.ir.inputs import scale_metas
from fusecut.optimizer.ir.wire import fusion_to_json, meta_to_json
from fusecut.optimizer.planner import make_plan
from fusecut.runtime.tensors import make_input
from fusecut.service.processes.results import ExecutionResult
from fusecut.service.processes.worker import Job, _Runner
from fusecut.service.app import create_app
from fusecut.service.settings import Settings
parsed = load("tests/corpus/softmax_fwd.py")
metas = scale_metas(parsed.inputs, 4096)
plan = make_plan(parsed.fusion, metas)
source = (json.dumps({"definition": fusion_to_json(parsed.fusion),
                      "inputs": [meta_to_json(m) for m in metas]}), json.dumps(plan.to_json()))
answer = _Runner().execute(Job(plan.plan_id, {"T0": make_input(metas[0])}), source)
create_app(Settings(db_path=":memory:", worker=False))
print(isinstance(answer, ExecutionResult), answer.backend)
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert run.stdout.split() == ["True", "reference"], run.stdout + run.stderr[-3000:]


def test_the_gpu_image_builds_the_native_launcher_and_names_its_driver():
    stages = dockerfile_stages()
    apt = " ".join(line for line in stages["base-gpu"] if "apt-get install" in line)
    assert "g++" in apt.split() and "python3-dev" in apt.split()  # compiler and Python.h
    final = " ".join(stages["fusecut"])
    assert "from fusecut.runtime.launcher import build; build()" in final
    cuda = re.search(r"FROM nvidia/cuda:(\d+)\.", (DOCKER / "Dockerfile").read_text()).group(1)
    assert cuda == "13"  # CUDA 13 needs driver 580 or newer: said where a user looks
    for path in (DOCKER / "Dockerfile", DOCKER / "compose.gpu.yaml", ROOT / "README.md"):
        assert re.search(r"driver[^.]*\b580\b", path.read_text()), path
