"""The safetensors format, read and written with torch copies that release the GIL.

The ``safetensors`` package copies a whole body while holding the GIL (about 1.2 ms per MB to
load, 2.3 to save): on a service thread that stalls the event loop for as long. Here a body's
tensors are copied out of it by numpy, and a response is assembled into a torch buffer by torch,
both of which let other threads run while they copy. Same format: an 8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and ``data_offsets`` into the data that
follows, tensors packed without gaps in offset order.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from fusecut.optimizer.errors import InputError

DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
          "U16": torch.uint16, "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64,
          "U64": torch.uint64, "F16": torch.float16, "BF16": torch.bfloat16,
          "F32": torch.float32, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
          "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu, "C64": torch.complex64}
# (complex128 and packed fp4 have no safetensors dtype)
NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000  # as the safetensors package
# With a cap on the tensor count, a header may take this much per tensor (its name, dtype, shape
# and offsets; 1.2M zero-size tensors made a 68 MB header whose parse took 1.5 GB) and this
# much more for its ``__metadata__``.
HEADER_BYTES_PER_TENSOR = 1024
METADATA_BYTES = 1 << 20
INT64_MAX = 2**63 - 1
MAX_RANK = 64


def _bad(why: str) -> InputError:
    return InputError(f"the tensors are not a valid safetensors file: {why}")


def _int(text: str) -> int:
    """A header's integer: int64 at most (Python refuses to convert more than 4,300 digits,
    with a ValueError that was a 500)."""
    if len(text.lstrip("-")) > 19:
        raise _bad(f"an integer of {len(text.lstrip('-'))} digits ({text[:20]}...); sizes and "
                   f"offsets are int64")
    return int(text)


def header_limit(max_tensors: int | None) -> int:
    """The longest header that can describe ``max_tensors`` tensors."""
    if max_tensors is None:
        return MAX_HEADER_BYTES
    return min(MAX_HEADER_BYTES, METADATA_BYTES + HEADER_BYTES_PER_TENSOR * max_tensors)


def load(blob: bytes | bytearray | memoryview,
         max_tensors: int | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors body (copies: the body may be freed). ``max_tensors``: the
    most it may hold (an execution's: its plan's input count), checked on the header's length
    before it is parsed, and on its entries after."""
    blob = memoryview(blob).cast("B")
    if len(blob) < 8:
        raise _bad("shorter than its 8-byte header length")
    n = int.from_bytes(blob[:8], "little")
    if n > len(blob) - 8:
        raise _bad(f"header length {n} runs past the end")
    limit = header_limit(max_tensors)
    if n > limit:
        raise _bad(f"a header of {n} bytes; one describing at most {max_tensors} tensor(s) "
                   f"(the plan's inputs) takes at most {limit}" if max_tensors is not None
                   else f"a header of {n} bytes, over the limit of {limit}")
    try:
        header = json.loads(bytes(blob[8:8 + n]), parse_int=_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(f"the header is not JSON ({e})") from None
    except RecursionError:  # a header nested 100,000 deep
        raise _bad("the header nests too deeply (a header is one flat JSON object)") from None
    except ValueError as e:  # anything else json refuses
        raise _bad(f"the header is not JSON ({str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise _bad("the header is not a JSON object")
    header.pop("__metadata__", None)
    if max_tensors is not None and len(header) > max_tensors:
        raise _bad(f"{len(header)} tensors; the plan takes {max_tensors} input(s)")
    data = blob[8 + n:]
    entries = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise _bad(f"tensor {name!r} needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            raise _bad(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and len(shape) <= MAX_RANK
                and all(type(e) is int and 0 <= e <= INT64_MAX for e in shape)):
            raise _bad(f"tensor {name!r}: shape must be at most {MAX_RANK} integers in "
                       f"[0, 2**63 - 1]")
        if math.prod(e for e in shape if e) > INT64_MAX:
            raise _bad(f"tensor {name!r}: shape {shape} has more than 2**63 - 1 elements")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(e) is int for e in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise _bad(f"tensor {name!r}: data_offsets must be [begin, end]")
        if offsets[1] - offsets[0] != math.prod(shape) * DTYPES[dtype].itemsize:
            raise _bad(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} "
                       f"of {dtype}")
        entries.append((offsets[0], offsets[1], name, DTYPES[dtype], shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    end = 0
    for begin, stop, name, _, _ in entries:
        if begin != end:
            raise _bad(f"tensor {name!r} does not start where the one before it ends")
        end = stop
    if end != len(data):
        raise _bad(f"the tensors take {end} bytes; the data has {len(data)}")
    return {name: tensor_from_bytes(data[begin:stop], dtype, shape)
            for begin, stop, name, dtype, shape in entries}


def tensor_from_bytes(raw: bytes | bytearray | memoryview, dtype: torch.dtype,
                      shape: tuple[int, ...] | list[int],
                      expand_to: tuple[int, ...] | None = None) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` holding a copy of ``raw``, made by numpy (which lets
    other threads run while it copies; torch.frombuffer would warn about read-only bytes);
    expanded (a view, stride 0 on its length-1 axes) to ``expand_to`` if given."""
    flat = torch.empty(len(memoryview(raw).cast("B")), dtype=torch.uint8)
    np.copyto(flat.numpy(), np.frombuffer(raw, dtype=np.uint8))
    tensor = flat.view(dtype).reshape(shape)
    return tensor if expand_to is None else tensor.expand(expand_to)


def metadata(blob: bytes | bytearray | memoryview) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors body (its header alone is read; {} if none)."""
    blob = memoryview(blob).cast("B")
    n = int.from_bytes(blob[:8], "little") if len(blob) >= 8 else 0
    if n > min(len(blob) - 8, MAX_HEADER_BYTES):
        raise _bad(f"header length {n} runs past the end")
    try:
        found = json.loads(bytes(blob[8:8 + n])).get("__metadata__") or {}
    except (ValueError, AttributeError, RecursionError):
        raise _bad("the header is not a JSON object") from None
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        raise _bad("__metadata__ must map names to strings")
    return found


def dump(tensors: dict[str, torch.Tensor],
         metadata: dict[str, str] | None = None) -> memoryview:
    """A safetensors body of ``tensors`` (dense, row-major, on the CPU), as a view of one buffer;
    ``metadata`` (strings) goes in its header's ``__metadata__``."""
    dense = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    header, offset = ({"__metadata__": metadata} if metadata else {}), 0
    for name, t in dense.items():
        if t.dtype not in NAMES:
            raise InputError(f"tensor {name}: safetensors has no dtype for {t.dtype}")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    start = 8 + len(text)
    out = torch.empty(start + offset, dtype=torch.uint8)  # not zeroed: every byte is written
    out[:start] = torch.frombuffer(bytearray(len(text).to_bytes(8, "little") + text),
                                   dtype=torch.uint8)
    for name, t in dense.items():
        begin, stop = header[name]["data_offsets"]
        if stop > begin:
            out[start + begin:start + stop] = t.reshape(-1).view(torch.uint8)
    return memoryview(out.numpy())
