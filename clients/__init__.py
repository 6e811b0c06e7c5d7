"""fusecut: plan and run GPU fusions so that the fewest bytes cross global memory.

    from fusecut import FusionDefinition, DataType

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(t0))
    outputs = fd.execute([torch.randn(4, 8)])
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING


def _source_checkout_rooms() -> None:
    """In a source checkout (no install, or an editable one) this package is clients/, and its
    rooms optimizer/, codegen/, runtime/ and service/ sit beside it at the repository's top
    level: let fusecut.optimizer and the rest be found there. An installed wheel has them inside
    this folder, whose parent (site-packages) is no fusecut checkout: nothing happens."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if ((root / "optimizer" / "__init__.py").is_file() and pyproject.is_file()
            and 'name = "fusecut"' in pyproject.read_text()):
        __path__.append(str(root))


_source_checkout_rooms()

from fusecut.optimizer.errors import (  # noqa: E402  (found through the rooms above)
    DefinitionError,
    FusecutError,
    InputError,
    PlanError,
)
from fusecut.version import __version__ as __version__  # noqa: E402  (fusecut.__version__)

# The heavy names (they import torch and httpx) load on first use, so that ``fusecut --help``
# and ``import fusecut`` for its errors start fast.
_LAZY = {
    "AsyncClient": "fusecut.client", "Client": "fusecut.client",
    "RemoteExecution": "fusecut.client", "ServiceError": "fusecut.client",
    "ServiceUnreachable": "fusecut.client",
    "DataType": "fusecut.definition", "FusionDefinition": "fusecut.definition",
    "ParallelType": "fusecut.definition", "PlanView": "fusecut.plan",
    "ParsedDefinition": "fusecut.optimizer.ir.nvtext", "parse_text": "fusecut.optimizer.ir.nvtext",
    # nvFuser's frontend API beyond the definition (its tests and programs import these)
    "clone": "fusecut.definition", "FusionProfile": "fusecut.definition",
    "FusionCache": "fusecut.fusion_cache", "LRUCache": "fusecut.fusion_cache",
    "LruFusionCache": "fusecut.fusion_cache",
    "enable_automatic_serialization": "fusecut.fusion_cache",
    "disable_automatic_serialization": "fusecut.fusion_cache",
    "compute_contiguity": "fusecut.optimizer.ir.descriptor",
    "compute_tensor_descriptor": "fusecut.optimizer.ir.descriptor",
    "ManualSchedulingError": "fusecut.optimizer.errors",
}

if TYPE_CHECKING:
    from fusecut.client import (
        AsyncClient,
        Client,
        RemoteExecution,
        ServiceError,
        ServiceUnreachable,
    )
    from fusecut.definition import DataType, FusionDefinition, FusionProfile, ParallelType, clone
    from fusecut.fusion_cache import (
        FusionCache,
        LRUCache,
        LruFusionCache,
        disable_automatic_serialization,
        enable_automatic_serialization,
    )
    from fusecut.optimizer.errors import ManualSchedulingError
    from fusecut.optimizer.ir.descriptor import compute_contiguity, compute_tensor_descriptor
    from fusecut.optimizer.ir.nvtext import ParsedDefinition, parse_text  # noqa: F401
    from fusecut.plan import PlanView

__all__ = [
    "AsyncClient", "Client", "DataType", "DefinitionError", "FusecutError", "FusionCache",
    "FusionDefinition", "FusionProfile", "InputError", "LRUCache", "LruFusionCache",
    "ManualSchedulingError", "ParallelType", "ParsedDefinition", "PlanError", "PlanView",
    "RemoteExecution", "ServiceError", "ServiceUnreachable", "clone", "compute_contiguity",
    "compute_tensor_descriptor",
    "disable_automatic_serialization", "enable_automatic_serialization", "load",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fusecut' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def load(path_or_text: str | Path) -> ParsedDefinition:
    """Parse an nvFuser repro, a wire-JSON definition or a POST /v1/plan body (a path or the
    text itself): the fusion and its input metadata."""
    if isinstance(path_or_text, Path) or (
            isinstance(path_or_text, str) and "\n" not in path_or_text
            and path_or_text.endswith((".py", ".json"))):
        text = Path(path_or_text).read_text()
    else:
        text = str(path_or_text)
    from fusecut.sources import parse_any

    return parse_any(text)
