"""KServe-v2-style JSON tensors to and from numpy arrays, without torch.

The service decodes execute bodies and encodes their responses in its planner processes, which do
not import torch; ``tensor_wire`` wraps these for torch tensors. A JSON tensor is
``{"name", "shape", "datatype", "data"}`` with row-major ``data``; non-finite floats travel as
the strings "nan", "inf" and "-inf".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fusecut.optimizer.errors import InputError

ITEMSIZES = {"BOOL": 1, "INT32": 4, "INT64": 8, "FP16": 2, "BF16": 2, "FP32": 4, "FP64": 8}
FLOATS = frozenset({"FP16", "BF16", "FP32", "FP64"})
INT_RANGES = {"INT32": (-2**31, 2**31 - 1), "INT64": (-2**63, 2**63 - 1)}
_WORDS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def check_header(item: dict[str, Any], max_elements: int) -> int:
    """The element count of a JSON tensor whose datatype and shape are valid and within
    ``max_elements``: checked before any of its data is looked at."""
    name = item.get("name", "?")
    if item.get("datatype") not in ITEMSIZES:
        raise InputError(f"tensor {name}: datatype must be one of {sorted(ITEMSIZES)}, got "
                         f"{item.get('datatype')!r}")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(e, int) and not isinstance(e, bool)
                                              and e >= 0 for e in shape) or len(shape) > 16:
        raise InputError(f"tensor {name}: shape must be a list of non-negative integers")
    n = math.prod(shape)
    if n > max_elements:
        raise InputError(f"tensor {name}: {n} elements is over the limit of {max_elements}")
    return n


def decode(item: dict[str, Any], max_elements: int) -> np.ndarray:
    """The values of a JSON tensor, shaped: float64 for the float datatypes (converted to the
    narrow ones by the caller, as torch rounds), int64 for the integer ones (range-checked), bool
    for BOOL."""
    n = check_header(item, max_elements)
    name, datatype, data = item.get("name", "?"), item["datatype"], item.get("data")
    if not isinstance(data, list):
        raise InputError(f"tensor {name}: data must be a flat list of numbers")
    if len(data) != n:
        raise InputError(f"tensor {name}: shape {item['shape']} needs {n} values, got "
                         f"{len(data)}")
    is_float = datatype in FLOATS
    if is_float and any(isinstance(v, str) for v in data):
        data = [_WORDS.get(v, v) if isinstance(v, str) else v for v in data]
    for v in data:
        if isinstance(v, bool) and datatype != "BOOL":
            raise InputError(f"tensor {name}: expected numbers, got a bool")
        if not isinstance(v, (int, float, bool)):
            raise InputError(f"tensor {name}: data must hold numbers, got {v!r}")
    if datatype in INT_RANGES:
        low, high = INT_RANGES[datatype]
        for v in data:
            if isinstance(v, int) and not low <= v <= high:
                raise InputError(f"tensor {name}: {v} is out of the range of {datatype} "
                                 f"[{low}, {high}]")
    try:
        if is_float:
            values = np.array(data, dtype=np.float64)
        elif datatype == "BOOL":
            values = np.array(data).astype(np.bool_)
        else:  # integers (floats among them truncate, as a cast does)
            values = np.array(data).astype(np.int64)
        return values.reshape(item["shape"])
    except (OverflowError, TypeError, ValueError) as e:
        raise InputError(f"tensor {name}: {e}") from None


def encode(name: str, values: np.ndarray, datatype: str) -> dict[str, Any]:
    """A JSON tensor of ``values`` (float16/bfloat16 given as float64 or float32)."""
    data = values.reshape(-1).tolist()
    if datatype in FLOATS:
        data = [_finite(v) for v in data]
    return {"name": name, "shape": list(values.shape), "datatype": datatype, "data": data}


def _finite(v: float):
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
