"""Pictures of a plan: Graphviz DOT text and a self-contained SVG (no Graphviz, no CDN).

Both draw from the plan's JSON form, so the CLI and the service's dashboard share them: segments
as boxes in execution order (kind, ops, bytes), fusion inputs on the left, outputs on the right,
and an arrow for each tensor that crosses global memory, labelled with its bytes.
"""

from __future__ import annotations

from html import escape
from typing import Any

KIND_COLOURS = {"pointwise": "#d8ecff", "reduction": "#ffe9c7", "normalization": "#dff5d8",
                "inner_outer": "#e8dcff", "library": "#f2f2f2", "fallback": "#ffd8d8"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _edges(plan: dict[str, Any]):
    """(source, target, tensor, bytes): 'in:T' and 'out:T' for fusion inputs and outputs."""
    written_by = {}
    for seg in plan["segments"]:
        for t in seg["outputs"]:
            written_by.setdefault(t["tensor"], seg["index"])
    edges = []
    for seg in plan["segments"]:
        for t in seg["inputs"]:
            src = written_by.get(t["tensor"])
            edges.append((f"in:{t['tensor']}" if src is None or src >= seg["index"]
                          else f"seg{src}", f"seg{seg['index']}", t["tensor"], t["bytes"]))
    outputs = set(plan.get("fusion_outputs", []))
    for seg in plan["segments"]:
        for t in seg["outputs"]:
            readers = [e for e in edges if e[2] == t["tensor"] and e[0] == f"seg{seg['index']}"]
            if t["tensor"] in outputs or not readers:
                edges.append((f"seg{seg['index']}", f"out:{t['tensor']}", t["tensor"], t["bytes"]))
    return edges


def to_dot(plan: dict[str, Any]) -> str:
    lines = ["digraph plan {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=10];']
    for seg in plan["segments"]:
        label = (f"segment {seg['index']}\\n{seg['kind']}\\n{len(seg['ops'])} ops"
                 f" ({len(seg['recomputed_ops'])} recomputed)\\n"
                 f"read {human_bytes(seg['read_bytes'])}, write {human_bytes(seg['write_bytes'])}")
        colour = KIND_COLOURS.get(seg["kind"], "#ffffff")
        lines.append(f'  seg{seg["index"]} [shape=box, style=filled, fillcolor="{colour}", '
                     f'label="{label}"];')
    nodes = set()
    for src, dst, tensor, size in _edges(plan):
        for n in (src, dst):
            if ":" in n and n not in nodes:
                nodes.add(n)
                lines.append(f'  "{n}" [shape=plaintext, label="{n.split(":")[1]}"];')
        lines.append(f'  "{src}" -> "{dst}" [label="{tensor}\\n{human_bytes(size)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_svg(plan: dict[str, Any]) -> str:
    segs = plan["segments"]
    edges = _edges(plan)
    ins = sorted({s for s, _, _, _ in edges if s.startswith("in:")})
    outs = sorted({d for _, d, _, _ in edges if d.startswith("out:")})
    box_w, box_h, gap_x, col_w = 170, 74, 70, 110
    height = max(len(ins), len(outs), 1) * 34 + 60
    height = max(height, box_h + 80)
    width = col_w * 2 + len(segs) * (box_w + gap_x) + 20
    pos: dict[str, tuple[float, float]] = {}
    for k, name in enumerate(ins):
        pos[name] = (10 + col_w - 20, 40 + k * 34)
    for k, seg in enumerate(segs):
        x = col_w + 20 + k * (box_w + gap_x)
        y = height / 2 - box_h / 2 + (k % 2) * 10
        pos[f"seg{seg['index']}"] = (x, y)
    for k, name in enumerate(outs):
        pos[name] = (width - col_w + 10, 40 + k * 34)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica,Arial,sans-serif" '
             f'font-size="11">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
             'fill="#555"/></marker></defs>']

    def anchor(node: str, side: str) -> tuple[float, float]:
        x, y = pos[node]
        if node.startswith("seg"):
            return (x + (box_w if side == "right" else 0), y + box_h / 2)
        return (x + (0 if node.startswith("in:") else -4), y)

    for src, dst, tensor, size in edges:
        x1, y1 = anchor(src, "right")
        x2, y2 = anchor(dst, "left")
        mx = (x1 + x2) / 2
        crossing = src.startswith("seg") and dst.startswith("seg")
        colour = "#c0392b" if crossing else "#777"
        parts.append(f'<path d="M {x1:.1f} {y1:.1f} C {mx:.1f} {y1:.1f}, {mx:.1f} {y2:.1f}, '
                     f'{x2:.1f} {y2:.1f}" fill="none" stroke="{colour}" stroke-width="'
                     f'{2 if crossing else 1}" marker-end="url(#arrow)"><title>{escape(tensor)}: '
                     f'{human_bytes(size)}</title></path>')
        if crossing:
            parts.append(f'<text x="{mx:.1f}" y="{(y1 + y2) / 2 - 4:.1f}" text-anchor="middle" '
                         f'fill="{colour}">{escape(tensor)} {human_bytes(size)}</text>')
    for name in ins + outs:
        x, y = pos[name]
        anchor_text = "end" if name.startswith("in:") else "start"
        parts.append(f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="{anchor_text}">'
                     f'{escape(name.split(":")[1])}</text>')
    for seg in segs:
        x, y = pos[f"seg{seg['index']}"]
        colour = KIND_COLOURS.get(seg["kind"], "#ffffff")
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{box_w}" height="{box_h}" rx="6" '
                     f'fill="{colour}" stroke="#333"/>')
        rows = [f"segment {seg['index']}: {seg['kind']}",
                f"{len(seg['ops'])} ops, {len(seg['recomputed_ops'])} recomputed",
                f"read {human_bytes(seg['read_bytes'])}",
                f"write {human_bytes(seg['write_bytes'])}"]
        for k, row in enumerate(rows):
            weight = ' font-weight="bold"' if k == 0 else ""
            parts.append(f'<text x="{x + 8:.1f}" y="{y + 18 + k * 15:.1f}"{weight}>'
                         f'{escape(row)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
