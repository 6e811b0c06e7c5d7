"""``dynamo.rewrite``: a cross-entropy's pick of each row's target is sunk below the
log-softmax's pointwise ops, so the region never writes the log-probabilities of every class."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from fusecut.dynamo.compiler import DECOMPOSITIONS
from fusecut.dynamo.rewrite import POINTWISE, sink_gathers
from tests.dynamo.regions_made import last_serial, regions_since

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
    serial = last_serial()
    with torch.no_grad():
        got = torch.compile(loss_of, backend="fusecut")(logits, target)
    torch.testing.assert_close(got, loss_of(logits, target))
    (region,) = regions_since(serial)
    report = region.report()
    assert report.planned_bytes <= 1.01 * report.lower_bound_bytes, report.summary()


def _shifted_loss(logits, labels):
    # Hugging Face's ForCausalLMLoss: float32 logits viewed as rows, labels shifted by padding
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                           ignore_index=-100)


def test_a_view_of_a_cast_of_an_input_becomes_a_cast_of_its_view_and_back_at_the_output():
    from fusecut.dynamo.rewrite import hoist_views

    def fn(x, w):
        rows = x.float().view(-1, 10)  # a view of a cast of an input
        grad = (rows - rows.amax(1, keepdim=True)).view(2, 3, 10)
        return grad.to(torch.bfloat16) @ w  # a cast of a view, read by a matmul

    x, w = torch.randn(2, 3, 10, dtype=torch.bfloat16), torch.randn(10, 4, dtype=torch.bfloat16)
    gm = make_fx(fn, decomposition_table=DECOMPOSITIONS)(x, w)
    assert hoist_views(gm) == 2
    assert hoist_views(gm) == 0  # a fixed point: moved views are not moved back
    casts = [n for n in gm.graph.nodes if n.target in (aten._to_copy.default,
                                                       torch.ops.prims.convert_element_type.default)]
    # the input's cast reads its view; the output's cast feeds a view, not the reverse
    assert casts[0].args[0].target is aten.view.default
    assert casts[0].args[0].args[0].op == "placeholder"
    assert [u.target for u in casts[-1].users] == [aten.view.default]
    torch.testing.assert_close(gm(x, w), fn(x, w))


def test_a_hugging_face_loss_forward_and_backward_move_no_more_than_their_floor():
    # GPT-2's and Llama's loss on the H200: the reshape of float32 logits into rows stood
    # between the cast and the softmax's reductions, so both regions wrote float32 logits
    # (planned 5.0x and 7.0x the floor at 2 x 256 x 1000)
    logits = torch.randn(2, 16, 3000, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 3000, (2, 16))
    want = _shifted_loss(logits, labels)
    (want_grad,) = torch.autograd.grad(want, logits)
    torch._dynamo.reset()
    serial = last_serial()
    got = torch.compile(_shifted_loss, backend="fusecut")(logits, labels)
    (grad,) = torch.autograd.grad(got, logits)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, want_grad)
    regions = regions_since(serial)
    assert {r.direction for r in regions} == {"forward", "backward"}
    for region in regions:
        report = region.report()
        assert report.planned_bytes <= 1.02 * report.lower_bound_bytes, report.summary()


def _layers_with_a_mask_each(x, positions):
    # as Hugging Face's attention writes it: each layer builds the same causal mask
    for _ in range(4):
        mask = torch.where(positions[None, :] <= positions[:, None], 0.0, -1e4)
        x = torch.tanh(x + mask.expand(x.shape[0], -1, -1))
    return x


def test_each_layers_identical_mask_is_computed_once_forward_and_backward():
    # GPT-2 small on the H200: twelve identical [8, 1, 1024, 1024] masks, each written by its
    # region and copied dense after it, forward and again in the backward
    x = torch.randn(2, 8, 8, requires_grad=True)
    positions = torch.arange(8)
    want = _layers_with_a_mask_each(x, positions)
    (want_grad,) = torch.autograd.grad(want.sum(), x)
    torch._dynamo.reset()
    serial = last_serial()
    got = torch.compile(_layers_with_a_mask_each, backend="fusecut")(x, positions)
    (grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad, want_grad)
    regions = regions_since(serial)
    assert {r.direction for r in regions} == {"forward", "backward"}
    masks = [n for r in regions for n in r.aten_module.graph.nodes
             if n.target in (aten.where.self, aten.le.Tensor, aten.ge.Tensor)]
    # one comparison and one where in the forward; the backward recomputes or reads them
    assert sum(n.target is aten.where.self for n in masks) <= 2, [str(n) for n in masks]


def test_an_inference_graphs_identical_masks_are_computed_once():
    x, positions = torch.randn(2, 8, 8), torch.arange(8)
    torch._dynamo.reset()
    serial = last_serial()
    with torch.no_grad():
        got = torch.compile(_layers_with_a_mask_each, backend="fusecut")(x, positions)
    torch.testing.assert_close(got, _layers_with_a_mask_each(x, positions))
    regions = regions_since(serial)
    assert {r.direction for r in regions} == {"inference"}
    wheres = [n for r in regions for n in r.aten_module.graph.nodes if n.target is aten.where.self]
    assert len(wheres) == 1, [str(n) for n in wheres]
