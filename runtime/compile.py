"""NVRTC compilation with an in-memory and on-disk cache.

Sources compile through cuda-python (``cuda.core``'s Program) to a cubin for one architecture;
headers such as ``cuda_bf16.h`` are found with ``cuda.pathfinder``. The cache key is the SHA-256 of
the source, the architecture, the options and the NVRTC version, so a warm process never
recompiles and a new process reuses the disk cache (``$FUSECUT_CACHE_DIR``, default
``$XDG_CACHE_HOME/fusecut/kernels``, ``~/.cache`` without XDG_CACHE_HOME). NVRTC needs no GPU:
CI compiles every generated kernel.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fusecut import environment
from fusecut.runtime.lru import BoundedCache

OPTIONS = ("std=c++17",)


class CompileError(RuntimeError):
    """NVRTC rejected a generated kernel (a fusecut bug: the log says where)."""


class GPUSupportMissing(RuntimeError):
    """cuda-python is not installed: fusecut was installed without its ``gpu`` extra."""


@functools.lru_cache(maxsize=1)
def require_cuda_python() -> None:
    """Raise GPUSupportMissing, saying what to install, unless cuda-python is importable: a
    CPU install leaves it out (issue 32: it was ~430 MB of nvidia/* wheels on every install)."""
    try:
        import cuda.bindings.driver  # noqa: F401
        import cuda.core  # noqa: F401
    except ImportError:
        raise GPUSupportMissing("generated kernels need cuda-python (NVRTC and the CUDA driver "
                                "bindings), which fusecut installs with its gpu extra: pip "
                                "install 'fusecut[gpu]'") from None


_prepare_lock = threading.Lock()


def prepare() -> None:
    """Import cuda-python's NVRTC side once, one thread at a time. ``cuda.core`` picks its
    CUDA-version module while it is imported, and threads importing it at once (compile-ahead
    workers beside the main thread, in a fresh process) were handed it half made: "cannot import
    name 'Program' from 'cuda.core.cu13'" on the H100. Cheap after the first call."""
    with _prepare_lock:
        require_cuda_python()  # imports cuda.core
        defines()  # the cache key's parts, and the header search (pathfinder imports lazily)
        nvrtc_version()
        try:
            include_dirs()
        except CompileError:
            pass  # a cubin from the disk cache needs none; a compile says they are missing


@dataclass
class CompileStats:
    compiles: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    seconds: float = 0.0


STATS = CompileStats()
MAX_CUBINS = 512  # in memory; the disk cache keeps every one
_memory: BoundedCache[str, bytes] = BoundedCache(MAX_CUBINS)
_lock = threading.Lock()  # guards STATS and _in_flight
_in_flight: dict[str, threading.Event] = {}  # cache keys being compiled, set when done


def cache_dir() -> Path:
    return environment.path("FUSECUT_CACHE_DIR")


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    from cuda import pathfinder

    found = pathfinder.find_nvidia_header_directory("cudart")
    if not found:
        raise CompileError("CUDA runtime headers (cuda_fp16.h, cuda_bf16.h) were not found; "
                           "pip install 'fusecut[gpu]' (cuda-python[all]) or the CUDA toolkit")
    return (str(found),)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=1)
def defines() -> tuple[str, ...]:
    """Macros that make kernels follow the installed torch where torch's own semantics changed:
    torch < 2.12 casts a float past float8_e4m3fn's range (and inf) to NaN, later versions
    saturate to +-448 (the preamble's fc_f_to_e4m3 does either)."""
    import torch

    overflow = torch.tensor([1000.0]).to(torch.float8_e4m3fn).float()
    return ("FC_E4M3_OVERFLOW_NAN",) if bool(overflow.isnan()) else ()


def cache_key(source: str, arch: str) -> str:
    blob = "\0".join([source, arch, *OPTIONS, *defines(), nvrtc_version()])
    return hashlib.sha256(blob.encode()).hexdigest()


def compile_cubin(source: str, arch: str = "sm_90", name: str = "fusecut") -> bytes:
    """The cubin of ``source`` for ``arch``, from cache when possible. Single-flight: a caller
    asking for a source another thread is compiling (``runtime.ahead``'s workers) waits for
    that compile instead of running NVRTC a second time."""
    prepare()
    key = cache_key(source, arch)
    while True:
        hit = _memory.get(key)
        if hit is not None:
            with _lock:
                STATS.memory_hits += 1
            return hit
        with _lock:
            running = _in_flight.get(key)
            if running is None:
                _in_flight[key] = threading.Event()
                break
        running.wait()  # then the memory cache has it, or that compile failed: try ourselves
    try:
        return _compile_uncached(source, arch, name, key)
    finally:
        with _lock:
            _in_flight.pop(key).set()


def _compile_uncached(source: str, arch: str, name: str, key: str) -> bytes:
    """From the disk cache, or NVRTC (then into both caches)."""
    path = cache_dir() / f"{key}.cubin"
    if path.exists():
        data = path.read_bytes()
        _memory.put(key, data)
        with _lock:
            STATS.disk_hits += 1
        return data
    start = time.perf_counter()
    data = _nvrtc(source, arch, name)
    elapsed = time.perf_counter() - start
    _memory.put(key, data)
    with _lock:
        STATS.compiles += 1
        STATS.seconds += elapsed
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: concurrent processes never see half a file
    except OSError:
        pass  # a read-only home still compiles; it just does not persist
    return data


def _nvrtc(source: str, arch: str, name: str) -> bytes:
    """NVRTC's cubin of ``source``, compiled in a child process (``runtime.nvrtc_child``)."""
    from fusecut.runtime.nvrtc_child import compile_in_child

    return compile_in_child(source, arch, name, include_dirs(), defines())


def clear_memory_cache() -> None:
    _memory.clear()
