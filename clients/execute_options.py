"""The keyword options of nvFuser's ``fd.execute``, and what fusecut does with each.

Every option nvFuser's ``execute`` takes is either implemented (``device``, ``profile``,
``print_repro``, ``capture_debug_output``, ``save_repro_inputs``), true of fusecut by
construction (``override_user_schedule``: fusecut always schedules automatically), or refused
with an error that says why. ``_enable_options``/``_disable_options`` name nvFuser's
NVFUSER_ENABLE/NVFUSER_DISABLE switches: those that cannot change what fusecut computes are
accepted (the table says why each is a no-op here); those that ask for something fusecut does not
do are refused; unknown names are refused, listing the known ones. Nothing is silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from fusecut.optimizer.errors import FusecutError


class ExecuteOptionError(FusecutError):
    """An ``fd.execute`` option fusecut cannot honour."""


# (switch, name) -> None when accepted (the reason it changes nothing here), or the refusal
_ACCEPTED = {
    ("enable", "host_ir_lowering"): "fusecut always lowers stream-parallel axes to a host "
                                    "program",
    ("disable", "infer_contiguity"): "fusecut computes outputs in their own dense layout; no "
                                     "contiguity is inferred from the inputs",
    ("enable", "id_model"): "an nvFuser-internal indexing model; fusecut has its own",
    ("enable", "id_model_extra_validation"): "nvFuser-internal IR checks",
    ("disable", "id_model"): "an nvFuser-internal indexing model; fusecut has its own",
    ("enable", "kernel_debug"): "fusecut's generated kernels are readable source already",
    ("enable", "kernel_lineinfo"): "line info only affects profiling tools",
    ("disable", "compile_to_sass"): "NVRTC's PTX is JIT-compiled by the driver either way",
    ("disable", "kernel_reuse"): "a compiled kernel for the same source is the same kernel",
    ("disable", "parallel_compile"): "fusecut compiles segments one after another",
    ("disable", "fma"): "fusecut's generated kernels are compiled without --use_fast_math",
}
# Switches that ask for generated matmul kernels: a fusion without matmul or linear runs as it
# would without them; one with a matmul is refused when it runs (``generated_matmul``), as
# nvFuser refuses what its matmul scheduler cannot take
_MATMUL_KERNELS = {("enable", "fuse_matmul"), ("disable", "matmul_expr_eval"),
                   ("enable", "fuse_multiple_matmuls")}
MATMUL_REFUSAL = ("Can not find a scheduler to schedule fusion segment: fusecut runs matmul and "
                  "linear as library calls (cuBLAS through torch) and generates no matmul kernels, "
                  "which {switches} ask for")
_REFUSED = {
    ("disable", "resize_scheduler"): "fusecut schedules resize ops (slice, pad, cat) "
                                     "automatically; they cannot be switched off",
}


@dataclass(frozen=True)
class ExecuteOptions:
    """nvFuser's execute keywords, checked. ``planning`` holds fusecut's own plan options."""

    device: torch.device | None = None
    profile: bool = False
    print_repro: bool = False
    capture_debug_output: bool = False
    save_repro_inputs: bool = False
    planning: dict[str, Any] = field(default_factory=dict)
    generated_matmul: tuple[str, ...] = ()  # the switches asking for matmul kernels

    def check_fusion(self, fusion: Any) -> None:
        """Refuse the matmul-kernel switches for a fusion that has a matmul or linear."""
        if self.generated_matmul and any(op.name in ("matmul", "linear") for op in fusion.ops):
            raise ExecuteOptionError(MATMUL_REFUSAL.format(
                switches=" and ".join(self.generated_matmul)))

    @property
    def plain(self) -> bool:
        """Nothing beyond running (the warm fast path applies)."""
        return not (self.profile or self.print_repro or self.capture_debug_output
                    or self.save_repro_inputs or self.planning or self.device is not None)


def check_switches(kind: str, names: Iterable[str] | None) -> list[str]:
    """Accept the NVFUSER_ENABLE/DISABLE names that change nothing in fusecut; refuse others.
    Returns the switches that ask for generated matmul kernels."""
    matmul = []
    for name in names or ():
        if not isinstance(name, str):
            raise ExecuteOptionError(f"_{kind}_options entries must be strings, got {name!r}")
        if (kind, name) in _ACCEPTED:
            continue
        if (kind, name) in _MATMUL_KERNELS:
            matmul.append(f"_{kind}_options=[{name!r}]")
            continue
        why = _REFUSED.get((kind, name))
        if why is not None:
            raise ExecuteOptionError(f"_{kind}_options=[{name!r}] cannot be honoured: {why}")
        known = sorted(n for k, n in (*_ACCEPTED, *_REFUSED, *_MATMUL_KERNELS) if k == kind)
        raise ExecuteOptionError(f"_{kind}_options: unknown option {name!r}; fusecut knows "
                                 f"{', '.join(known)}")
    return matmul


def resolve_device(device: Any) -> torch.device | None:
    """nvFuser's ``device=`` (an index, a string or a torch.device): a CUDA device."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise ExecuteOptionError(f"device must be a CUDA device, got {device!r}")
    if isinstance(device, int):
        return torch.device("cuda", device)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ExecuteOptionError(f"device {device!r} is not a device: {e}") from None
    if device.type != "cuda":
        raise ExecuteOptionError("If device argument is passed it must be a CUDA device "
                                 f"(got {device})")
    return device


def parse_execute_options(options: dict[str, Any]) -> ExecuteOptions:
    """Split ``fd.execute``'s keywords into nvFuser's (checked) and fusecut's plan options."""
    options = dict(options)
    matmul = check_switches("enable", options.pop("_enable_options", None)) + \
        check_switches("disable", options.pop("_disable_options", None))
    override = options.pop("override_user_schedule", False)
    if override not in (True, False):
        raise ExecuteOptionError(f"override_user_schedule must be True or False, got "
                                 f"{override!r}")
    # override_user_schedule=True asks for the automatic schedule: fusecut's only one
    flags = {}
    for key in ("profile", "print_repro", "capture_debug_output", "save_repro_inputs"):
        value = options.pop(key, False)
        if value not in (True, False):
            raise ExecuteOptionError(f"{key} must be True or False, got {value!r}")
        flags[key] = bool(value)
    device = resolve_device(options.pop("device", None))
    return ExecuteOptions(device=device, planning=options, generated_matmul=tuple(matmul),
                          **flags)
