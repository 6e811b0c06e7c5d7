"""The SDK's clients when the service is not there (issue 32: a bare httpx ConnectError, without
the URL)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
import torch

import fusecut

TEXT = ("def f(fd):\n"
        "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
        "    fd.add_output(fd.ops.neg(T0))\n")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_service_that_is_down_is_a_fusecut_error_naming_the_url():
    url = f"http://127.0.0.1:{closed_port()}"
    x = torch.randn(4)
    with fusecut.Client(url) as client:
        for call in (lambda: client.plan(TEXT, [x]), lambda: client.get_plan("0" * 32),
                     lambda: client.execute(TEXT, [x])):
            with pytest.raises(fusecut.ServiceUnreachable) as caught:
                call()
            assert isinstance(caught.value, fusecut.FusecutError)
            assert f"cannot connect to the fusecut service at {url}/v1/" in str(caught.value)
            assert "fusecut serve" in str(caught.value)
            assert isinstance(caught.value.__cause__, httpx.ConnectError)

    async def run_async() -> list[Exception]:
        errors = []
        async with fusecut.AsyncClient(url) as client:
            for call in (lambda: client.plan(TEXT, [x]), lambda: client.get_plan("0" * 32),
                         lambda: client.execute(TEXT, [x])):
                try:
                    await call()
                except Exception as e:
                    errors.append(e)
        return errors

    errors = asyncio.run(run_async())
    assert len(errors) == 3
    for error in errors:
        assert isinstance(error, fusecut.ServiceUnreachable), repr(error)
        assert error.url.startswith(f"{url}/v1/") and url in str(error)

    fd = fusecut.FusionDefinition()
    with fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=fusecut.DataType.Float)
        fd.add_output(fd.ops.neg(t0))
    with pytest.raises(fusecut.ServiceUnreachable, match=f"at {url}/v1/execute"):
        fd.execute([x], remote=url)


def test_a_service_that_does_not_answer_is_a_fusecut_error_naming_the_url():
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with fusecut.Client(url, timeout=0.3) as client, \
                pytest.raises(fusecut.ServiceUnreachable) as caught:
            client.get_plan("0" * 32)
    assert f"the fusecut service at {url}/v1/plans/{'0' * 32} did not answer in time" \
        in str(caught.value)
