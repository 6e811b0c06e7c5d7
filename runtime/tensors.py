"""torch <-> IR glue: dtype mapping, metadata of real tensors, and tensors made from metadata."""

from __future__ import annotations

import torch

from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir.dtypes import EXTENDED, DType
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta

TORCH_DTYPE: dict[DType, torch.dtype] = {
    DType.bool: torch.bool,
    DType.int32: torch.int32,
    DType.int64: torch.int64,
    DType.float16: torch.float16,
    DType.bfloat16: torch.bfloat16,
    DType.float32: torch.float32,
    DType.float64: torch.float64,
    # torch has no unpacked fp4: DType.float4_e2m1fn has no torch tensor (planning only)
    **{d: getattr(torch, d.value) for d in EXTENDED if hasattr(torch, d.value)},
}
FROM_TORCH: dict[torch.dtype, DType] = {v: k for k, v in TORCH_DTYPE.items()}


def to_torch_dtype(dtype: DType) -> torch.dtype:
    try:
        return TORCH_DTYPE[dtype]
    except KeyError:
        raise InputError(f"torch has no {dtype.value} tensors: values of this dtype can be planned "
                         f"but not made or run here") from None


def from_torch_dtype(dtype: torch.dtype) -> DType:
    try:
        return FROM_TORCH[dtype]
    except KeyError:
        raise InputError(f"unsupported tensor dtype {dtype}") from None


def with_cpu_scalars_on_device(args: list) -> list:
    """``args`` with 0-d CPU tensors moved to the GPU of the other tensors.

    nvFuser takes a 0-d CPU tensor beside GPU tensors as a scalar (``from_pytorch`` declares it
    ``is_cpu``). A kernel handed its host pointer would fault and poison the CUDA context, so it
    goes to the device first. A CPU tensor with dimensions beside GPU tensors is refused: nvFuser
    refuses it too, and copying it each call would hide a slow program."""
    device = None
    cpu = False
    for a in args:
        if type(a) is torch.Tensor or isinstance(a, torch.Tensor):
            if a.is_cuda:
                device = device or a.device
            else:
                cpu = True
    if device is None or not cpu:
        return args
    out = list(args)
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor) and not a.is_cuda:
            if a.dim() != 0:
                raise InputError(
                    f"input {k} is a CPU tensor of shape {tuple(a.shape)} beside tensors on "
                    f"{device}: only 0-d CPU tensors (scalars) may be mixed with GPU tensors; "
                    f"move it with .to('{device}')")
            out[k] = a.to(device)
    return out


def meta_of(value) -> InputMeta:
    """Metadata of a fusion argument: a tensor, or a Python number for a scalar input."""
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(value.shape), tuple(value.stride()), from_torch_dtype(value.dtype))
    if isinstance(value, bool):
        return ScalarMeta(DType.bool, value)
    if isinstance(value, int):
        return ScalarMeta(DType.int64, value)
    if isinstance(value, float):
        return ScalarMeta(DType.float64, value)
    if isinstance(value, complex):
        return ScalarMeta(DType.complex128, value)
    raise InputError(f"fusion arguments must be tensors or numbers, got {type(value).__name__}")


def unshare(outputs: list, args: list, positions=None) -> list:
    """Outputs never share memory with an argument (unless the definition asked for it with
    ``alias_input``, which updates the argument in place instead): a ``set``, a same-dtype
    ``cast``, a view op or an output that is itself an input would otherwise hand the caller its
    own tensor back, and writing to the output would change the input. Clones each output at
    ``positions`` (all of them by default) that does; an output that is an input comes back as a
    copy too (nvFuser may return the input itself there; fusecut never aliases silently)."""
    shared = {a.untyped_storage().data_ptr() for a in args
              if isinstance(a, torch.Tensor) and a.numel()}
    if not shared:
        return outputs
    for k in range(len(outputs)) if positions is None else positions:
        out = outputs[k]
        if isinstance(out, torch.Tensor) and out.numel() and \
                out.untyped_storage().data_ptr() in shared:
            outputs[k] = out.clone()
    return outputs


def storage_extent(shape, strides) -> int:
    if not all(shape):
        return 0
    return 1 + sum((e - 1) * s for e, s in zip(shape, strides))


def make_input(meta: InputMeta, device: str | torch.device = "cpu",
               generator: torch.Generator | None = None):
    """A real argument for ``meta``: random data of the kind the repro asked for, same strides."""
    if isinstance(meta, ScalarMeta):
        return meta.value if meta.value is not None else (1.0 if meta.dtype.is_float else 1)
    fill = meta.fill or {}
    fn = fill.get("fn", "randn")
    n = storage_extent(meta.shape, meta.strides)
    dt = to_torch_dtype(meta.dtype)
    kw = {"device": device}
    if meta.dtype.is_bool:
        base = torch.rand(n, generator=generator, **kw)
        threshold = fill.get("threshold", 0.5)
        flat = base < threshold if fill.get("compare") in ("lt", "lte") else base > threshold
    elif not meta.dtype.is_float:
        low, high = fill.get("low", 0), fill.get("high", 8)
        if fn == "full":
            flat = torch.full((n,), fill.get("value", 0), dtype=dt, **kw)
        elif fn == "arange":
            flat = torch.arange(n, dtype=dt, **kw)
        else:
            flat = torch.randint(int(low), int(high), (n,), dtype=dt, generator=generator, **kw)
    elif meta.dtype is DType.float4_e2m1fn_x2:  # torch cannot convert to packed fp4: raw bytes
        flat = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator, **kw).view(dt)
    elif fn == "rand":
        flat = torch.rand(n, generator=generator, dtype=torch.float32, **kw).to(dt)
    elif fn in ("zeros", "empty"):
        flat = torch.zeros(n, dtype=dt, **kw)
    elif fn == "ones":
        flat = torch.ones(n, dtype=dt, **kw)
    elif fn in ("full", "tensor"):
        flat = torch.full((n,), float(fill.get("value", 0.0)), dtype=dt, **kw)
    else:
        flat = torch.randn(n, generator=generator, dtype=torch.float32, **kw).to(dt)
    return flat.as_strided(meta.shape, meta.strides)
