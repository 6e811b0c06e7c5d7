"""Plan pictures (optimizer.plan.render), checked by parsing the SVG: every edge joins the
boxes the plan says, runs through no other box, its labels cross no line, and the size is bounded
for huge plans."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from benchmarks.fusiongen import generate
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.plan.render import CHAR_W, MAX_SEGMENTS, to_svg
from fusecut.optimizer.planner import PlanOptions, make_plan
from tests.conftest import CORPUS

NS = "{http://www.w3.org/2000/svg}"


def _plan(text: str, metas=None, **options) -> dict:
    p = parse_text(text)
    return make_plan(p.fusion, metas if metas is not None else p.inputs,
                     PlanOptions(**options)).to_json()


def _svg(plan: dict):
    root = ET.fromstring(to_svg(plan))
    rects = {r.get("data-node"): tuple(float(r.get(k)) for k in ("x", "y", "width", "height"))
             for r in root.iter(f"{NS}rect") if r.get("data-node")}
    edges = []
    for p in root.iter(f"{NS}path"):
        if p.get("class") != "edge":
            continue
        nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", p.get("d"))]
        edges.append((p.get("data-from"), p.get("data-to"), p.get("data-tensor"),
                      list(zip(nums[::2], nums[1::2]))))
    labels = [(float(t.get("x")), float(t.get("y")), t.text) for t in root.iter(f"{NS}text")
              if t.get("class") == "label"]
    return root, rects, edges, labels


def _crosses(a, b, rect) -> bool:
    """Whether the axis-parallel segment a-b enters the interior of rect."""
    x, y, w, h = rect
    (x1, y1), (x2, y2) = a, b
    eps = 0.5
    return (max(x1, x2) > x + eps and min(x1, x2) < x + w - eps
            and max(y1, y2) > y + eps and min(y1, y2) < y + h - eps)


def check_picture(plan: dict) -> tuple[float, float]:
    root, rects, edges, labels = _svg(plan)
    segs = {f"seg{s['index']}": s for s in plan["segments"]}
    writes = {k: {t["tensor"] for t in s["outputs"]} for k, s in segs.items()}
    reads = {k: {t["tensor"] for t in s["inputs"]} for k, s in segs.items()}
    drawn = set(rects)
    for src, dst, tensor, points in edges:
        assert src in rects and dst in rects, (src, dst)
        # endpoints: the source box's right side, the target box's left side
        sx, sy, sw, sh = rects[src]
        dx, dy, dw, dh = rects[dst]
        assert points[0][0] == pytest.approx(sx + sw) and sy < points[0][1] < sy + sh
        assert points[-1][0] == pytest.approx(dx) and dy < points[-1][1] < dy + dh
        # the plan's word: who writes and who reads the tensor
        if src.startswith("seg") and dst.startswith("seg"):
            assert tensor in writes[src] and tensor in reads[dst], (src, dst, tensor)
            assert int(src[3:]) < int(dst[3:])
        elif src.startswith("in:"):
            assert dst.startswith("seg")
            if not tensor.endswith("tensors"):
                assert tensor in plan["fusion_inputs"] and tensor in reads[dst]
        else:
            assert dst.startswith("out:") and src.startswith("seg")
            if not tensor.endswith("outputs"):
                assert tensor in plan["fusion_outputs"] and tensor in writes[src]
        for a, b in zip(points, points[1:]):
            assert a[0] == b[0] or a[1] == b[1]  # orthogonal
            for node, rect in rects.items():
                if node not in (src, dst):
                    assert not _crosses(a, b, rect), (src, dst, tensor, node)
    # every boundary tensor between drawn segments has its edge
    pairs = {(s, d, t) for s, d, t, _ in edges}
    for b in plan["boundaries"]:
        for c in b["consumers"]:
            if f"seg{b['producer']}" in drawn and f"seg{c}" in drawn:
                assert (f"seg{b['producer']}", f"seg{c}", b["tensor"]) in pairs
    # labels cross no line
    for x, y, text in labels:
        box = (x, y - 11, len(text) * CHAR_W, 13)
        for *_, points in edges:
            for a, b in zip(points, points[1:]):
                assert not _crosses(a, b, box), text
    return float(root.get("width")), float(root.get("height"))


@pytest.mark.parametrize("name", ["seed_2146_rmsnorm_bwd", "layernorm_bwd",
                                  "seed_4269_forward_full"])
def test_corpus_pictures_tell_the_truth(name):
    plan = _plan((CORPUS / f"{name}.py").read_text(), time_limit_s=2.0)
    check_picture(plan)


def test_a_segment_draws_the_tensors_the_plan_says_it_writes():
    # seed_2146_rmsnorm_bwd: T131, T63 and T67 seemed to leave segment 1 while segment 0 wrote them
    plan = _plan((CORPUS / "seed_2146_rmsnorm_bwd.py").read_text(), time_limit_s=2.0)
    _, _, edges, _ = _svg(plan)
    for s in plan["segments"]:
        sent = {t for src, _, t, _ in edges if src == f"seg{s['index']}"}
        assert sent and sent <= {t["tensor"] for t in s["outputs"]}, s["index"]


def test_a_generated_plan_with_long_edges():
    plan = _plan(generate(400, seed=4), segmenter="greedy")
    assert len(plan["segments"]) > 3
    check_picture(plan)


def test_huge_plans_are_summarised():
    # 3,000 outputs drew a 102,060-px-tall picture
    lines = [f"    T{i} = fd.ops.mul(T0, T0)\n    fd.add_output(T{i})" for i in range(1, 3001)]
    text = ("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
            + "\n".join(lines) + "\n")
    plan = _plan(text, [tensor_meta((64,), DType.float32)], segmenter="greedy")
    width, height = check_picture(plan)
    assert width < 3000 and height < 3000
    # segment_set forces a boundary after every neg: one segment per pair
    lines = [f"    T{2 * i + 1} = fd.ops.neg(T{2 * i})\n"
             f"    T{2 * i + 2} = fd.ops.segment_set(T{2 * i + 1})" for i in range(60)]
    text = ("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
            + "\n".join(lines) + "\n    fd.add_output(T120)\n")
    many = _plan(text, [tensor_meta((64,), DType.float32)], segmenter="greedy")
    assert len(many["segments"]) > MAX_SEGMENTS
    width, height = check_picture(many)
    assert width < 20000 and height < 3000
    assert f"the first {MAX_SEGMENTS} of {len(many['segments'])} segments" in to_svg(many)


def test_the_picture_names_the_fusion_and_its_options():
    plan = _plan((CORPUS / "layernorm_bwd.py").read_text(), time_limit_s=2.0)
    svg = to_svg(plan)
    assert "fusion of" in svg and plan["ops"][0]["name"] in svg
    assert "segmenter cpsat" in svg and "device H100" in svg
