"""fusecut as a torch.compile backend: ``torch.compile(model, backend="fusecut")``.

Dynamo captures the graph; AOTAutograd traces forward and backward together, decomposes them
into core ATen ops (``aten.DECOMPOSITIONS``) and cuts the joint graph into a forward and a
backward (``partition``: which values the forward saves, which the backward recomputes). In
each graph, the fusible regions become fusecut definitions run through the engine (generated
kernels on a GPU, the torch reference on the CPU); matmuls, attention and the rest stay on
torch's kernels. ``backend(...)`` takes options; ``region_reports()`` says what became of every
region compiled in this process.

The backend is registered under the name "fusecut" through the ``torch_dynamo_backends``
entry point: it works after install, without importing fusecut.
"""

from __future__ import annotations

from fusecut.dynamo.compiler import Options, backend, fusecut_backend
from fusecut.dynamo.regions import region_reports
from fusecut.fronts import RegionReport

__all__ = ["Options", "RegionReport", "backend", "fusecut_backend", "region_reports"]
