"""Lets ``import thunder`` work before ``import fusecut``: Thunder 0.2.6 registers torch's
named-tensor methods at import, and torch 2.13 removed them.

The interpreter imports this module at start-up through ``fusecut-thunder.pth`` (shipped in the
wheel; ``make venv`` installs it for the editable checkout). It only adds a finder to
``sys.meta_path``; the first import of ``thunder`` then gives torch the stubs before Thunder's
own code runs. Nothing else is imported until then.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")


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


class _BeforeThunder(importlib.abc.MetaPathFinder):
    """Patches torch when ``thunder`` is first looked up, then steps aside for the real finders."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "thunder":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            patch_named_tensor_methods()
        return None


def install() -> None:
    if "thunder" not in sys.modules and not any(isinstance(f, _BeforeThunder)
                                                for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeThunder())


install()
