"""What installing fusecut brings (issue 32: 2.1 GB on a CPU machine, 430 MB of it NVIDIA
libraries the CPU path never loads, and about 50 lines of setuptools warnings)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_nvidia_libraries_come_with_the_gpu_extra_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("cuda")]
    assert project["optional-dependencies"]["gpu"] == ["cuda-python[all]>=12.6"]
    # the tests compile every generated kernel with NVRTC: `make venv` takes the extra
    assert "'.[dev,gpu," in (ROOT / "Makefile").read_text()


def test_without_cuda_python_a_gpu_run_says_what_to_install():
    probe = """
import sys
sys.modules["cuda"] = None  # as after a CPU install
from fusecut.runtime.compile import GPUSupportMissing, compile_cubin
try:
    compile_cubin("extern \\"C\\" __global__ void k() {}", "sm_90", "k")
except GPUSupportMissing as e:
    print(e)
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert "pip install 'fusecut[gpu]'" in run.stdout, run.stdout + run.stderr[-2000:]


def test_the_wheel_builds_without_warnings_and_holds_fusecut_alone(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    rooms = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for room in rooms["package-dir"].values():  # clients/, optimizer/, ...: one package
        shutil.copytree(ROOT / room, source / room,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path / "dist"
    out.mkdir()
    build = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         f"import setuptools.build_meta as b; print(b.build_wheel({str(out)!r}))"],
        capture_output=True, text=True, cwd=source, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    assert "is absent from the `packages` configuration" not in build.stderr, build.stderr
    assert "Warning" not in build.stderr, build.stderr[-3000:]
    (wheel,) = out.glob("fusecut-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "fusecut/runtime/native/launcher.cpp" in names
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"fusecut",
                                                                "fusecut-thunder.pth"}, top
    # every room inside the one package, and the source checkout's dev path nowhere
    assert {"fusecut/engine.py", "fusecut/thunder/executor.py", "fusecut/optimizer/planner.py",
            "fusecut/codegen/kernel.py", "fusecut/runtime/program.py",
            "fusecut/service/app.py"} <= set(names)
    assert not [n for n in names if "clients" in n or "devpath" in n], names
    # installed, the package's rooms are its own folders: nothing reaches back to a checkout
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
    probe = ("import fusecut, fusecut.optimizer.planner, fusecut.runtime.native, fusecut.dynamo;"
             "print(fusecut.__path__, fusecut.optimizer.planner.__file__)")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(unpacked)},
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [f"['{unpacked / 'fusecut'}']",
                                  str(unpacked / "fusecut/optimizer/planner.py")], run.stdout
    cuda = [line for line in metadata.splitlines() if "cuda-python" in line]
    assert cuda and all('extra == "gpu"' in line for line in cuda), cuda


def make_dry_run(target: str, venv: Path) -> str:
    """What ``make TARGET`` would run (``make -n``) with a virtual environment at ``venv``.

    The make that runs the tests (CI's ``make test``) must not leak in: under it this make is a
    sub-make and would add "Entering/Leaving directory" lines around what it prints."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
                          env=env).stdout


def test_make_run_installs_what_serving_needs_and_says_so(tmp_path):
    # issue 45: `make run` installed 2.1 GB silently (test tools, Ray, NVRTC) to serve on a CPU
    run = make_dry_run("run", tmp_path / "fresh")
    installs = [line for line in run.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all(line.rstrip().endswith("-e .") for line in installs), installs
    assert "-q" not in installs[0].split() and "GB" in run  # progress, and the size said
    assert "fusecut serve" in run.splitlines()[-1]
    # the tests keep everything they need, and CI keeps the whole suite
    test = make_dry_run("test", tmp_path / "fresh")
    assert "-e '.[dev,gpu,thunder,postgres,ray]'" in test and "pytest -q" in test
    assert "make test\n" in (ROOT / ".ci/run").read_text()
    quick = make_dry_run("test-quick", tmp_path / "fresh")
    assert "-e '.[dev,gpu,thunder,postgres,ray]'" in quick and "pytest -q" in quick
