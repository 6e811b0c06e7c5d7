"""The native warm-call launcher (fusecut/runtime/native/launcher.cpp): build it once, load it.

Why native: on the H100 box a Python warm call cannot get below about 16 us for one kernel
(torch.empty about 4-6 us, cuLaunchKernel through cuda-python or ctypes about 7-8 us, the
signature check about 1 us per tensor), while nvFuser's whole warm call takes about 11 us. The C++
launcher does the same work in a few microseconds plus the driver's own launch cost.

The source is compiled with the system C++ compiler against the installed torch's headers (no
CUDA toolkit needed: Python hands it cuLaunchKernel's address) into ``native`` beside
``$FUSECUT_CACHE_DIR`` (by default ``~/.cache/fusecut/native``, under XDG_CACHE_HOME when
set), keyed by source, torch and Python versions. The first build takes 15-30 s, so it runs in
a background thread: calls made meanwhile take the Python path, and later ones the native one.
``FUSECUT_NATIVE=0`` (or another false spelling: fusecut.environment's one rule) turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

from fusecut import environment
from fusecut.runtime.compile import cache_dir

SOURCE = Path(__file__).parent / "native" / "launcher.cpp"
MODULE = "fusecut_launcher"


class NativeBuildError(RuntimeError):
    """The launcher did not compile (no compiler, or headers missing); the Python path runs."""


_lock = threading.Lock()
_module: ModuleType | None = None
_failed: str | None = None
_thread: threading.Thread | None = None


def enabled() -> bool:
    return environment.flag("FUSECUT_NATIVE")


def build_dir() -> Path:
    import torch

    blob = "\0".join([SOURCE.read_text(), torch.__version__, sys.version, sys.platform])
    key = hashlib.sha256(blob.encode()).hexdigest()[:24]
    return cache_dir().parent / "native" / key


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def compile_command(out: Path) -> list[str]:
    from torch.utils import cpp_extension

    cxx = compiler()
    if cxx is None:
        raise NativeBuildError("no C++ compiler (c++, g++ or clang++) was found")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    return [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", "-w", "-D_GLIBCXX_USE_CXX11_ABI="
            + str(int(_cxx11_abi())), *[f"-I{p}" for p in includes], str(SOURCE),
            *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", str(out)]


def _cxx11_abi() -> bool:
    import torch

    return bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def build() -> ModuleType:
    """Compile (or find in the cache) and import the launcher; raises NativeBuildError."""
    directory = build_dir()
    so = directory / f"{MODULE}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    if not so.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = so.with_name(f"{MODULE}.{os.getpid()}.tmp.so")
        result = subprocess.run(compile_command(tmp), capture_output=True, text=True)
        if result.returncode != 0:
            raise NativeBuildError(f"the native launcher did not compile:\n{result.stderr[-2000:]}")
        tmp.replace(so)  # atomic: another process never loads half a file
    spec = importlib.util.spec_from_file_location(MODULE, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_in_background() -> None:
    global _module, _failed
    try:
        module = build()
    except Exception as e:  # no compiler, no headers: the Python path keeps running
        _failed = str(e)
        return
    _module = module


def native(wait: bool = False) -> ModuleType | None:
    """The launcher module when it is built; starts the build on first use. With ``wait``,
    block until the build has finished (benchmarks, tests)."""
    global _thread
    if _module is not None or not enabled():
        return _module
    with _lock:
        if _thread is None and _failed is None:
            _thread = threading.Thread(target=_build_in_background, daemon=True,
                                       name="fusecut-native-build")
            _thread.start()
    if wait and _thread is not None:
        _thread.join()
    return _module


def failure() -> str | None:
    """Why the launcher is not available, once a build has failed."""
    return _failed
