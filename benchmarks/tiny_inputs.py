"""Tiny versions of a case's inputs, for host-latency measurements: every axis shrunk to at most
16, the same dtypes, broadcast (stride-0) axes kept at stride 0 and every other axis packed densely
in the original's memory order."""

from __future__ import annotations

from dataclasses import replace

from fusecut.optimizer.ir.inputs import InputMeta, TensorMeta

TINY_DIM = 16


def dense_strides_like(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Strides that pack ``shape`` densely in the axis order of ``strides`` (largest stride
    outermost; equal strides keep axis order, as torch lays out size-1 axes), with the stride-0
    axes of ``strides`` left at 0."""
    if len(shape) != len(strides):
        raise ValueError(f"shape {shape} and strides {strides} differ in rank")
    outer_first = sorted(range(len(shape)), key=lambda i: (-strides[i], i))
    out = [0] * len(shape)
    step = 1
    for axis in reversed(outer_first):
        if strides[axis] == 0:
            continue
        out[axis] = step
        step *= max(shape[axis], 1)
    return tuple(out)


def shrink_meta(meta: InputMeta, limit: int = TINY_DIM) -> InputMeta:
    """``meta`` with every axis cut to ``min(extent, limit)``; scalars are unchanged."""
    if not isinstance(meta, TensorMeta):
        return meta
    shape = tuple(min(d, limit) for d in meta.shape)
    return replace(meta, shape=shape, strides=dense_strides_like(shape, meta.strides))


def shapes_text(metas: list[InputMeta]) -> str:
    """'16x16, 16' (scalars as 'scalar')."""
    return ", ".join(("x".join(map(str, m.shape)) or "()") if isinstance(m, TensorMeta)
                     else "scalar" for m in metas)
