"""A function of objects memoized on their identity, for the last arguments only: codegen asks
``fast_math_tensors`` and ``dynamic_scalars`` of one segment again for every region of its
kernel (eight times a normalization), and nothing else asks in between. The arguments are held
(not their ids), so a new object at an old address is never taken for the old one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


def last_call(fn: Callable[..., R]) -> Callable[..., R]:
    last: list[Any] = [(), None]  # the arguments and the result of the last call

    @functools.wraps(fn)
    def memoized(*args: Any) -> R:
        held_args, result = last  # read once: another thread may replace the pair meanwhile
        if len(held_args) == len(args) and all(a is b for a, b in zip(held_args, args)):
            return result
        result = fn(*args)
        last[:] = [args, result]
        return result

    return memoized
