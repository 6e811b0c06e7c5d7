"""Tensors on the wire: safetensors (binary) and a KServe-v2-style JSON form for small requests.

Both name tensors by the fusion input (and output) they are: ``T0``, ``T1``... A scalar input is a
0-d tensor. JSON tensors are ``{"name", "shape", "datatype", "data"}`` with row-major ``data``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from optimizer.errors import InputError

DATATYPES = {"BOOL": torch.bool, "INT32": torch.int32, "INT64": torch.int64,
             "FP16": torch.float16, "BF16": torch.bfloat16, "FP32": torch.float32,
             "FP64": torch.float64}
NAMES = {v: k for k, v in DATATYPES.items()}


def from_json(item: dict[str, Any], max_elements: int) -> torch.Tensor:
    name = item.get("name", "?")
    dtype = DATATYPES.get(item.get("datatype"))
    if dtype is None:
        raise InputError(f"tensor {name}: datatype must be one of {sorted(DATATYPES)}, got "
                         f"{item.get('datatype')!r}")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(e, int) and not isinstance(e, bool)
                                              and e >= 0 for e in shape) or len(shape) > 16:
        raise InputError(f"tensor {name}: shape must be a list of non-negative integers")
    n = math.prod(shape)
    if n > max_elements:
        raise InputError(f"tensor {name}: {n} elements is over the limit of {max_elements}")
    data = item.get("data")
    if not isinstance(data, list):
        raise InputError(f"tensor {name}: data must be a flat list of numbers")
    if len(data) != n:
        raise InputError(f"tensor {name}: shape {shape} needs {n} values, got {len(data)}")
    words = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
    if dtype.is_floating_point and any(isinstance(v, str) for v in data):
        data = [words.get(v, v) if isinstance(v, str) else v for v in data]
    for v in data:
        if isinstance(v, bool) and dtype is not torch.bool:
            raise InputError(f"tensor {name}: expected numbers, got a bool")
        if not isinstance(v, (int, float, bool)):
            raise InputError(f"tensor {name}: data must hold numbers, got {v!r}")
    if not dtype.is_floating_point and dtype is not torch.bool:
        info = torch.iinfo(dtype)
        for v in data:
            if isinstance(v, int) and not info.min <= v <= info.max:
                raise InputError(f"tensor {name}: {v} is out of the range of {NAMES[dtype]} "
                                 f"[{info.min}, {info.max}]")
    try:
        base = torch.tensor(data, dtype=torch.float64 if dtype.is_floating_point else None)
        return base.to(dtype).reshape(shape)
    except (RuntimeError, OverflowError, TypeError, ValueError) as e:
        raise InputError(f"tensor {name}: {e}") from None


def to_json(name: str, tensor: torch.Tensor) -> dict[str, Any]:
    t = tensor.detach().cpu().contiguous()
    data = t.to(torch.float64).reshape(-1).tolist() if t.dtype in (torch.float16,
                                                                     torch.bfloat16) \
        else t.reshape(-1).tolist()
    data = [_finite(v) for v in data] if t.is_floating_point() else data
    return {"name": name, "shape": list(t.shape), "datatype": NAMES[t.dtype], "data": data}


def _finite(v: float):
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def load_safetensors(blob: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(blob)
    except Exception as e:  # the format's own errors: bad header, truncated data
        raise InputError(f"the tensors are not a valid safetensors file: {e}") from None


def dump_safetensors(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def expand_declared_broadcasts(fusion, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Wire formats carry dense data: give axes the definition declares broadcast their stride 0
    back (an expanded broadcast must hold one value along the axis)."""
    out = dict(tensors)
    for name, value in tensors.items():
        t = fusion.tensors.get(name)
        if t is None or not isinstance(value, torch.Tensor) or value.dim() != t.rank:
            continue  # mismatches are reported, with names, by the input checks
        for axis, declared in enumerate(t.broadcast):
            if not declared or value.shape[axis] == 1 or value.stride(axis) == 0:
                continue
            first = value.narrow(axis, 0, 1)
            if not torch.equal(first.expand_as(value), value):
                raise InputError(f"input {name}: axis {axis} is declared broadcast, but its "
                                 f"{value.shape[axis]} entries differ")
            value = first.expand_as(value)
        out[name] = value
    return out


def to_device(value: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """``value`` on ``device`` with its stride-0 (expanded) axes kept: ``Tensor.to`` would
    materialise them, and a plan made for stride 0 then refuses the copy."""
    expanded = [axis for axis in range(value.dim()) if value.stride(axis) == 0]
    if not expanded or value.device == torch.device(device):
        return value.to(device)
    base = value
    for axis in expanded:
        base = base.narrow(axis, 0, 1)
    return base.to(device).expand(value.shape)
