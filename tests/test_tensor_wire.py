"""Tensors on the wire: round trips and the stride-0 axes a plan may be made for."""

from __future__ import annotations

import pytest
import torch

from optimizer.errors import InputError
from optimizer.ir import parse_text
from runtime.tensor_wire import (
    dump_safetensors,
    expand_declared_broadcasts,
    from_json,
    load_safetensors,
    to_device,
    to_json,
)

BROADCAST_ROW = parse_text("""
def f(fd):
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[None, True], dtype=DataType.Float)
    T1 = fd.ops.neg(T0)
    fd.add_output(T1)
""").fusion


def test_safetensors_and_json_round_trip():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # non-contiguous: sent dense
    back = load_safetensors(dump_safetensors({"T0": x}))["T0"]
    torch.testing.assert_close(back, x)
    assert from_json(to_json("T0", x), 1 << 20).tolist() == x.tolist()


def test_declared_broadcast_axes_get_stride_zero_back():
    dense = torch.randn(1, 5).repeat(4, 1)
    value = expand_declared_broadcasts(BROADCAST_ROW, {"T0": dense})["T0"]
    assert value.stride() == (0, 1)
    torch.testing.assert_close(value, dense)
    with pytest.raises(InputError, match="axis 0 is declared broadcast"):
        expand_declared_broadcasts(BROADCAST_ROW, {"T0": torch.randn(4, 5)})


def test_to_device_keeps_expanded_axes():
    expanded = torch.randn(1, 5).expand(4, 5)
    moved = to_device(expanded, "meta")  # Tensor.to would materialise the broadcast
    assert moved.device.type == "meta" and moved.shape == (4, 5) and moved.stride() == (0, 1)
    plain = torch.randn(3, 4).t()
    assert to_device(plain, "meta").stride() == plain.stride()
