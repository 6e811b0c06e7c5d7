"""``dynamo.proposal``: torch's capability-based partition proposal with bitsets. It must give
torch's partitions exactly (ids, nodes and their order): on random graphs with unsupported nodes
between supported ones (where merging would make cycles), tuples and their getitems, and on the
graphs of whole models' training steps."""

from __future__ import annotations

import operator
import random

import pytest
import torch
from torch.fx import Graph, GraphModule
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

import fusecut.dynamo.compiler
from fusecut.dynamo.aten import translatable
from fusecut.dynamo.proposal import propose_partitions
from tests.dynamo.hf_models import MODELS, batch


def _pair(a, b):
    return a, b


class _Supported(OperatorSupportBase):
    def __init__(self, supported):
        self.supported = supported

    def is_node_supported(self, submodules, node) -> bool:
        return self.supported(node)


def torchs(gm: GraphModule, supported) -> list:
    return CapabilityBasedPartitioner(gm, _Supported(supported),
                                      allows_single_node_partition=True).propose_partitions()


def as_lists(partitions) -> list:
    return [(p.id, [(n.name, order) for n, order in p.nodes.items()]) for p in partitions]


def random_graph(seed: int) -> tuple[GraphModule, set[str]]:
    """A DAG of adds (some unsupported: the matmuls between regions) and pairs read through
    getitems, every node reading one or two earlier ones."""
    rng = random.Random(seed)
    g = Graph()
    values = [g.placeholder(f"x{i}") for i in range(rng.randint(1, 3))]
    supported = set()
    for _ in range(rng.randint(5, 60)):
        args = [rng.choice(values[-8:]) for _ in range(2)]
        if rng.random() < 0.15:
            pair = g.call_function(_pair, tuple(args))
            values += [g.call_function(operator.getitem, (pair, k)) for k in (0, 1)]
            node = pair
        else:
            node = g.call_function(operator.add, tuple(args))
            values.append(node)
        if rng.random() < 0.7:
            supported.add(node.name)
            supported |= {u.name for u in node.users}  # a pair's getitems go with it
    g.output(tuple(values[-3:]))
    return GraphModule(torch.nn.Module(), g), supported


@pytest.mark.parametrize("seed", range(300))
def test_on_random_graphs_the_partitions_are_torchs(seed):
    gm, names = random_graph(seed)
    supported = lambda n: n.name in names  # noqa: E731
    assert as_lists(propose_partitions(gm, supported)) == as_lists(torchs(gm, supported))


def test_on_whole_models_the_partitions_are_torchs(monkeypatch):
    seen = []
    fuse = fusecut.dynamo.compiler.fuse_regions

    def compared(gm, direction, *args):
        want = as_lists(torchs(gm, translatable))
        assert as_lists(propose_partitions(gm, translatable)) == want, direction
        seen.append((direction, len(want)))
        return fuse(gm, direction, *args)

    monkeypatch.setattr(fusecut.dynamo.compiler, "fuse_regions", compared)
    for name in ("gpt2", "llama", "t5"):
        torch._dynamo.reset()
        model = MODELS[name]()
        out = torch.compile(model, backend="fusecut")(**batch(name, torch.Generator()
                                                              .manual_seed(0)))
        out.loss.backward()
    torch._dynamo.reset()
    assert {d for d, _ in seen} == {"forward", "backward"} and sum(k for _, k in seen) > 50
