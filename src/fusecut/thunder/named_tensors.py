"""Lets ``import thunder`` work before ``import fusecut``: Thunder 0.2.6 registers torch's
named-tensor methods at import, and torch 2.13 removed them.

``fusecut-thunder.pth`` (shipped in the wheel; ``make venv`` installs it for the editable
checkout) puts a one-line finder on ``sys.meta_path`` at interpreter start-up, importing nothing.
The first lookup of ``thunder`` calls ``before_thunder()`` here, which takes that finder off the
path and gives torch the stubs before Thunder's own code runs. ``thunder.executor`` calls
it too, for an interpreter started without the .pth.
"""

from __future__ import annotations

import sys
from typing import Any

_NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")
FINDER_MARK = "fusecut_before_thunder"  # the attribute the .pth's finder carries


def patch_named_tensor_methods() -> None:
    """Give torch.Tensor a stub for each named-tensor method it lacks (named as torch would name
    it, which Thunder checks); calling one says that named tensors are gone."""
    import torch

    for name in _NAMED_TENSOR_METHODS:
        if hasattr(torch.Tensor, name):
            continue

        def removed(*args: Any, _name: str = name, **kwargs: Any) -> Any:
            raise NotImplementedError(f"torch.Tensor.{_name} (named tensors) was removed from "
                                      f"this torch build")

        removed.__name__ = removed.__qualname__ = name
        setattr(torch.Tensor, name, removed)


def before_thunder() -> None:
    """Called by the .pth's finder on the first lookup of ``thunder``: step aside for the real
    finders, and patch torch first. Returns None: the finder finds nothing itself."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, FINDER_MARK, False)]
    patch_named_tensor_methods()
