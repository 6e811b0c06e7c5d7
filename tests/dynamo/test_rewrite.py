"""``dynamo.rewrite``: a cross-entropy's pick of each row's target is sunk below the
log-softmax's pointwise ops, so the region never writes the log-probabilities of every class."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import fusecut.dynamo
from fusecut.dynamo.compiler import DECOMPOSITIONS
from fusecut.dynamo.rewrite import POINTWISE, sink_gathers

aten = torch.ops.aten


def _picked_log_probabilities(logits, target):
    return F.log_softmax(logits.float(), dim=-1).gather(1, target[:, None]).squeeze(1)


def test_a_gather_of_a_log_softmax_becomes_a_gather_of_the_logits():
    logits, target = torch.randn(6, 10, dtype=torch.bfloat16), torch.randint(0, 10, (6,))
    gm = make_fx(_picked_log_probabilities, decomposition_table=DECOMPOSITIONS)(logits, target)
    assert sink_gathers(gm) == 1
    gathers = [n for n in gm.graph.nodes if n.target is aten.gather.default]
    assert len(gathers) == 1 and gathers[0].args[0].target not in POINTWISE
    # what is gathered now is the logits (or a view of them), not a float32 (6, 10) result
    assert gathers[0].args[0].meta["val"].dtype == torch.bfloat16
    torch.testing.assert_close(gm(logits, target), _picked_log_probabilities(logits, target))


def test_a_gather_whose_operand_broadcasts_along_another_axis_is_left_alone():
    def fn(x, row, target):
        return (x * row).gather(1, target)  # row: (1, 10), broadcast over x's rows

    x, row, target = torch.randn(6, 10), torch.randn(1, 10), torch.randint(0, 10, (6, 1))
    gm = make_fx(fn)(x, row, target)
    assert sink_gathers(gm) == 0
    torch.testing.assert_close(gm(x, row, target), fn(x, row, target))


def test_a_cross_entropys_forward_region_moves_no_more_than_its_logits():
    # the H200 profile of GPT-2's step: the loss's regions wrote float32 log-probabilities
    # (7 GB planned against a 2.4 GB floor at 8 x 1024 x 50304)
    def loss_of(logits, target):
        return F.cross_entropy(logits.float(), target, ignore_index=-100)

    logits, target = torch.randn(64, 3000, dtype=torch.bfloat16), torch.randint(0, 3000, (64,))
    torch._dynamo.reset()
    serial = max((r.serial for r in fusecut.dynamo.regions.live_regions()), default=-1)
    with torch.no_grad():
        got = torch.compile(loss_of, backend="fusecut")(logits, target)
    torch.testing.assert_close(got, loss_of(logits, target))
    (region,) = [r for r in fusecut.dynamo.regions.live_regions() if r.serial > serial]
    report = region.report()
    assert report.planned_bytes <= 1.01 * report.lower_bound_bytes, report.summary()
