"""What Thunder 0.2.6 needs of its environment, set up before its first import.

- torch's named-tensor methods: Thunder registers them at import, and torch 2.13 removed them;
  ``patch_named_tensor_methods`` gives torch stubs of them.
- a cuDNN frontend that can load: ``fusecut[thunder]`` brings nvidia-cudnn-frontend (Thunder's
  cudnn executor runs attention with it), but on a machine whose torch has no cuDNN (a CPU
  build) Thunder's import calls ``cudnn.backend_version()`` and fails. There
  ``hide_unloadable_cudnn`` makes ``import cudnn`` an ImportError, which Thunder reads as "no
  cudnn executor".

``fusecut-thunder.pth`` (shipped in the wheel; ``make venv`` installs it for the editable
checkout) puts a one-line finder on ``sys.meta_path`` at interpreter start-up, importing nothing.
The first lookup of ``thunder`` calls ``before_thunder()`` here, which takes that finder off the
path and does both before Thunder's own code runs. ``fusecut.thunder.executor`` calls it too,
for an interpreter started without the .pth.
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


def hide_unloadable_cudnn() -> None:
    """Where torch has no cuDNN, make ``import cudnn`` fail as if the frontend were absent (a
    None in sys.modules is an ImportError). Where torch has cuDNN, or the frontend was already
    imported, nothing changes."""
    import torch

    if "cudnn" not in sys.modules and not torch.backends.cudnn.is_available():
        sys.modules["cudnn"] = None  # type: ignore[assignment]


def before_thunder() -> None:
    """Called by the .pth's finder on the first lookup of ``thunder``: step aside for the real
    finders, and prepare torch first. Returns None: the finder finds nothing itself."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, FINDER_MARK, False)]
    patch_named_tensor_methods()
    hide_unloadable_cudnn()
