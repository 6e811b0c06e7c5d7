"""fusecut: plan and run GPU fusions so that the fewest bytes cross global memory.

    from fusecut import FusionDefinition, DataType

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(t0))
    outputs = fd.execute([torch.randn(4, 8)])
"""

from __future__ import annotations

from pathlib import Path

from fusecut.client import AsyncClient, Client, RemoteExecution, ServiceError
from fusecut.definition import DataType, FusionDefinition, ParallelType
from fusecut.plan import Plan
from optimizer.errors import DefinitionError, FusecutError, InputError, PlanError
from optimizer.ir.nvtext import ParsedDefinition, parse_text

__all__ = [
    "AsyncClient", "Client", "DataType", "DefinitionError", "FusecutError", "FusionDefinition",
    "InputError", "ParallelType", "ParsedDefinition", "Plan", "PlanError", "RemoteExecution",
    "ServiceError", "load",
]
__version__ = "0.1.0"


def load(path_or_text: str | Path) -> ParsedDefinition:
    """Parse an nvFuser repro (a path or the text itself): the fusion and its input metadata."""
    if isinstance(path_or_text, Path) or (
            isinstance(path_or_text, str) and "\n" not in path_or_text
            and path_or_text.endswith(".py")):
        text = Path(path_or_text).read_text()
    else:
        text = str(path_or_text)
    return parse_text(text)
