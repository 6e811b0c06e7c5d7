"""NVRTC in child processes: a compiler crash costs one compile, not the user's process.

NVRTC is a library inside the calling process, and it can crash on valid source: NVRTC 13.0 and
13.5 die with a segmentation fault compiling a normalization kernel that gathers a half-precision
row through a permuted input (``benchmarks.gpu_fuzz`` seed 2188). In process that ends a
training run, the service's worker or a test run. Each compile therefore runs in a child
(``python -m fusecut.runtime.nvrtc_child``, which imports only cuda-python); a child that dies
raises a ``CompileError`` naming the kernel and the signal, which the callers already handle (a
Thunder region then runs on torch, ``fd.execute`` reports it). Children are kept for later
compiles, one per concurrent caller (compile-ahead threads compile in parallel), and end with
their parent (their standard input closes).

The protocol: length-prefixed pickles on the child's standard input and output; a request is
(source, arch, name, include dirs, defines), a reply ("ok", cubin) or ("error", message).
"""

from __future__ import annotations

import atexit
import pickle
import signal
import struct
import subprocess
import sys
import threading
from typing import Any, BinaryIO

from fusecut.runtime.compile import CompileError

_HEADER = struct.Struct("<Q")


def _send(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (n,) = _HEADER.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


class _Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "fusecut.runtime.nvrtc_child"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def compile(self, request: tuple) -> tuple[str, Any]:
        _send(self.proc.stdin, request)
        return _receive(self.proc.stdout)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_idle: list[_Child] = []
_lock = threading.Lock()


def compile_in_child(source: str, arch: str, name: str, include: tuple[str, ...],
                     defines: tuple[str, ...]) -> bytes:
    """The cubin NVRTC makes of ``source`` (a ``CompileError`` with NVRTC's log when it refuses
    it, or naming the signal when NVRTC crashes)."""
    with _lock:
        child = _idle.pop() if _idle else None
    child = child or _Child()
    try:
        status, value = child.compile((source, arch, name, include, defines))
    except (EOFError, OSError, pickle.UnpicklingError):
        code = child.proc.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        raise CompileError(f"NVRTC crashed compiling {name} ({arch}): {how}") from None
    with _lock:
        _idle.append(child)
    if status != "ok":
        raise CompileError(value)
    return value


@atexit.register
def _close_children() -> None:
    with _lock:
        children, _idle[:] = list(_idle), []
    for child in children:
        child.close()


# ---- the child ---------------------------------------------------------------------------------


def _nvrtc(source: str, arch: str, name: str, include: tuple[str, ...],
           defines: tuple[str, ...]) -> bytes:
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(arch=arch, std="c++17", include_path=list(include),
                             define_macro=list(defines) or None)
    try:
        module = Program(source, "c++", options=options).compile("cubin", name_expressions=())
    except Exception as e:  # NVRTC reports through exceptions carrying its log
        raise CompileError(f"NVRTC failed for {name} ({arch}): {e}") from e
    return bytes(module.code)


def main() -> None:
    """Compile requests from standard input until it closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the replies
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        try:
            reply = ("ok", _nvrtc(*request))
        except CompileError as e:
            reply = ("error", str(e))
        _send(stdout, reply)


if __name__ == "__main__":
    main()
