"""Tensors on the wire: round trips and the stride-0 axes a plan may be made for."""

from __future__ import annotations

import pytest
import torch

from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir import parse_text
from fusecut.wire.tensors import (
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


def test_safetensors_are_read_and_written_as_the_safetensors_package_does():
    # fusecut's own reader and writer (torch and numpy copies that let other threads run)
    import safetensors.torch as package

    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5), "c": torch.randn(2, 3).bfloat16(),
               "empty": torch.empty(0, 3), "flag": torch.tensor(True),
               "half": torch.randn(7).half()}
    for read in (load_safetensors(package.save(tensors)), package.load(dump_safetensors(tensors))):
        assert set(read) == set(tensors)
        for name, t in tensors.items():
            assert read[name].dtype == t.dtype and torch.equal(read[name], t), name
    read = load_safetensors(package.save(tensors))["a"]
    read[0, 0] = 1.0  # writable: the runtime may update inputs in place


@pytest.mark.parametrize("blob, why", [
    (b"", "shorter than"),
    ((16).to_bytes(8, "little") + b"{}", "runs past the end"),
    ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
    ((3).to_bytes(8, "little") + b"{x}", "not JSON"),
])
def test_invalid_safetensors_are_refused_naming_the_problem(blob, why):
    with pytest.raises(InputError, match=why):
        load_safetensors(blob)


def test_safetensors_offsets_must_tile_the_data():
    good = dump_safetensors({"a": torch.randn(4), "b": torch.randn(2)})
    for blob, why in ((good[:-1], "the data has"), (good + b"\0", "the data has")):
        with pytest.raises(InputError, match=why):
            load_safetensors(blob)
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}'
    with pytest.raises(InputError, match="4 bytes for shape"):
        load_safetensors(len(header).to_bytes(8, "little") + header + bytes(4))
    header = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    with pytest.raises(InputError, match="does not start where"):
        load_safetensors(len(header).to_bytes(8, "little") + header + bytes(8))


def test_every_dtype_crosses_the_worker_pipe_and_stride_zero_axes_stay():
    # issue 19, defect 1: a tiny uint16/32/64 or float8 tensor went through torch's own pickling,
    # which cannot load them ("UntypedStorage has no attribute dtype"): the worker died
    import socket
    from multiprocessing.connection import Connection

    from fusecut.service.processes.worker import _recv, _send

    ours, theirs = (Connection(s.detach()) for s in socket.socketpair())
    sent = [torch.arange(3).to(dtype) for dtype in (
        torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
        torch.float8_e8m0fnu, torch.bfloat16, torch.bool, torch.complex128)]
    sent += [torch.randn(1, 5).expand(4, 5), torch.tensor(2.5), torch.empty(0, 3),
             torch.randn(1 << 15)]
    _send(ours, {"args": sent})
    got = _recv(theirs)["args"]
    for a, b in zip(sent, got, strict=True):
        assert (b.dtype, b.shape, b.stride()) == (a.dtype, a.shape, a.stride())
        raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        assert torch.equal(raw(a), raw(b))
    ours.close()
    theirs.close()


def test_an_expanded_tensor_crosses_the_worker_pipe():
    # an output of shape [N] and stride 0 (a reduction of a broadcast scalar) killed the worker:
    # narrowed to one element it was "contiguous" with stride 0, which .view(uint8) refused
    import socket
    from multiprocessing.connection import Connection

    from fusecut.service.processes.worker import _recv, _send

    a, b = socket.socketpair()
    ours, theirs = Connection(a.detach()), Connection(b.detach())
    sent = {"row": torch.tensor([2.5]).expand(3072), "grid": torch.arange(3.).expand(4, 3),
            "one": torch.tensor([7.0]).as_strided((1,), (0,))}
    _send(ours, sent)
    got = _recv(theirs)
    for name, value in sent.items():
        assert got[name].shape == value.shape and torch.equal(got[name], value), name
