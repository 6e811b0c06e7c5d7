"""Tensors on the wire: safetensors (binary) and a KServe-v2-style JSON form for small requests.

Both name tensors by the fusion input (and output) they are: ``T0``, ``T1``... A scalar input is a
0-d tensor. JSON tensors are ``{"name", "shape", "datatype", "data"}`` with row-major ``data``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fusecut.optimizer.errors import InputError
from fusecut.wire import safetensors
from fusecut.wire.json_tensors import decode, encode

DATATYPES = {"BOOL": torch.bool, "INT32": torch.int32, "INT64": torch.int64,
             "FP16": torch.float16, "BF16": torch.bfloat16, "FP32": torch.float32,
             "FP64": torch.float64}
NAMES = {v: k for k, v in DATATYPES.items()}
# the dtypes each response format carries, and how a refusal names it
WIRES = {"json": (NAMES, "KServe-v2 JSON (send safetensors to get it)"),
         "safetensors": (safetensors.NAMES, "safetensors")}


def from_json(item: dict[str, Any], max_elements: int) -> torch.Tensor:
    return from_array(decode(item, max_elements), item["datatype"])


def from_array(values: np.ndarray, datatype: str) -> torch.Tensor:
    """A decoded JSON tensor (``json_tensors.decode``) as a tensor of its datatype."""
    return torch.from_numpy(values).to(DATATYPES[datatype])


def to_json(name: str, tensor: torch.Tensor) -> dict[str, Any]:
    return encode(name, to_array(tensor), NAMES[tensor.dtype])


def to_array(tensor: torch.Tensor) -> np.ndarray:
    """The values of ``tensor`` for ``json_tensors.encode`` (half floats widened to float64)."""
    t = tensor.detach().cpu().contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.to(torch.float64)
    return t.numpy()


def load_safetensors(blob: bytes | bytearray | memoryview,
                     max_tensors: int | None = None) -> dict[str, torch.Tensor]:
    return safetensors.load(blob, max_tensors)


def dump_safetensors(tensors: dict[str, torch.Tensor]) -> bytes:
    return bytes(safetensors.dump(tensors))


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


def arguments(fusion, tensors: dict[str, torch.Tensor]) -> list[Any]:
    """The fusion's arguments from tensors named by its inputs: declared broadcasts expanded
    (see above), each scalar input (a one-element tensor) as its Python value. The inputs are
    the caller's: an unseeded random op's seed and offset are drawn when the plan runs."""
    inputs = fusion.caller_inputs()
    missing = [n for n in inputs if n not in tensors]
    extra = sorted(set(tensors) - set(inputs))
    if missing or extra:
        raise InputError(f"the definition's inputs are {inputs}; missing {missing}, "
                         f"unexpected {extra}")
    tensors = expand_declared_broadcasts(fusion, tensors)
    return [scalar_value(n, tensors[n]) if n in fusion.scalars else tensors[n] for n in inputs]


def scalar_value(name: str, value: torch.Tensor) -> Any:
    """A scalar input travels as a one-element tensor."""
    if value.numel() != 1:
        raise InputError(f"scalar input {name} must be a one-element tensor, got shape "
                         f"{list(value.shape)}")
    return value.item()


def check_encodable(fusion, wire: str) -> None:
    """Refuse, before running, a fusion with an output the response's ``wire`` ("json" or
    "safetensors") cannot carry."""
    from fusecut.runtime.tensors import TORCH_DTYPE

    names, what = WIRES[wire]
    for name in fusion.outputs:
        dtype = fusion.value_dtype(name)
        if TORCH_DTYPE.get(dtype) not in names:
            raise InputError(f"output {name} is {dtype.value}, which {what} cannot carry")


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
