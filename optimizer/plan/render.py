"""Pictures of a plan: Graphviz DOT text and a self-contained SVG (no Graphviz, no CDN).

Both draw from the plan's JSON form, so the CLI and the service's dashboard share them: segments
as boxes in execution order (kind, ops, bytes), fusion inputs on the left, outputs on the right,
and an arrow for each tensor that crosses global memory, labelled with its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from fusecut.optimizer.errors import counted

KIND_COLOURS = {"pointwise": "#d8ecff", "reduction": "#ffe9c7", "normalization": "#dff5d8",
                "inner_outer": "#e8dcff", "library": "#f2f2f2", "fallback": "#ffd8d8"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_rate(bytes_per_s: float) -> str:
    """A bandwidth in decimal units, three significant digits: "1.23 GB/s", "456 kB/s"."""
    for unit in ("B/s", "kB/s", "MB/s", "GB/s", "TB/s"):
        if abs(bytes_per_s) < 999.5 or unit == "TB/s":
            return f"{_digits(bytes_per_s)} {unit}"
        bytes_per_s /= 1000
    return ""


def human_seconds(seconds: float) -> str:
    """A duration, three significant digits: "12.3 us", "4.56 ms", "1.2 s"."""
    for unit, scale in (("us", 1e-6), ("ms", 1e-3)):
        if seconds < 999.5 * scale:
            return f"{_digits(seconds / scale)} {unit}"
    return f"{_digits(seconds)} s"


def _digits(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 999.5 else f"{value:.0f}"


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


# ---- the SVG --------------------------------------------------------------------------------
# A layered layout: each segment sits in the column after the latest segment it reads from
# (fusion inputs in a column on the left, outputs on the right). Edges are orthogonal and run
# only through the gaps between columns: from the producing box's right side to a vertical track
# in the next gap, then straight into the consumer when it is in the next column, or else up to a
# band above every box, across, and down a track in the gap before the consumer. Each tensor a
# segment writes has its own anchor on the box's right side, labelled once there, left of every
# track. Huge plans are summarised: at most MAX_SEGMENTS boxes, and a segment's fusion outputs
# (or all fusion inputs) share one port when there are too many to list.

MAX_SEGMENTS = 40
MAX_PORTS = 24  # fusion inputs or outputs drawn one by one
OUTPUTS_PER_SEGMENT = 4  # more fusion outputs of one segment share a port
BOX_W, ROW_H, BOX_GAP = 170, 15, 22
LABEL_W, TRACK_STEP, PORT_W = 100, 6, 120
CHAR_W = 6.2  # an estimate of the width of a character at font-size 11


def _short(text: str, width: float) -> str:
    n = max(3, int(width / CHAR_W))
    return text if len(text) <= n else text[:n - 1] + "\u2026"


def _layout_edges(plan: dict[str, Any], shown: set[int]):
    """(source, target, tensor, bytes, label) over the drawn segments: 'seg<k>', 'in:<port>' and
    'out:<port>' nodes; ports name a tensor or a summary."""
    writer: dict[str, int] = {}
    for seg in plan["segments"]:
        for t in seg["outputs"]:
            writer.setdefault(t["tensor"], seg["index"])
    fusion_inputs = plan.get("fusion_inputs") or []
    group_inputs = len(fusion_inputs) > MAX_PORTS
    edges = []
    for seg in plan["segments"]:
        if seg["index"] not in shown:
            continue
        for t in seg["inputs"]:
            src = writer.get(t["tensor"])
            if src is not None and src < seg["index"]:
                if src in shown:
                    edges.append((f"seg{src}", f"seg{seg['index']}", t["tensor"], t["bytes"]))
            else:
                port = f"in:{len(fusion_inputs)} fusion inputs" if group_inputs \
                    else f"in:{t['tensor']}"
                edges.append((port, f"seg{seg['index']}", t["tensor"], t["bytes"]))
    fusion_outputs = plan.get("fusion_outputs") or []
    per_seg: dict[int, list[dict[str, Any]]] = {}
    for seg in plan["segments"]:
        for t in seg["outputs"]:
            if t["tensor"] in fusion_outputs and writer.get(t["tensor"]) == seg["index"] \
                    and seg["index"] in shown:
                per_seg.setdefault(seg["index"], []).append(t)
    group_all = sum(len(v) for v in per_seg.values()) > MAX_PORTS
    for k, ts in per_seg.items():
        if group_all or len(ts) > OUTPUTS_PER_SEGMENT:
            names = ", ".join(t["tensor"] for t in ts[:3])
            outputs = counted(len(ts), "output")
            port = f"out:{outputs} of segment {k} ({names}{', ...' if len(ts) > 3 else ''})"
            edges.append((f"seg{k}", port, outputs, sum(t["bytes"] for t in ts)))
        else:
            edges.extend((f"seg{k}", f"out:{t['tensor']}", t["tensor"], t["bytes"]) for t in ts)
    merged: dict[tuple[str, ...], list] = {}  # grouped inputs: one edge per segment
    for src, dst, tensor, size in edges:
        key = (src, dst) if group_inputs and src.startswith("in:") else (src, dst, tensor)
        e = merged.setdefault(key, [src, dst, tensor, 0, 0])
        e[3] += size
        e[4] += 1
    return [(src, dst, tensor if n == 1 else f"{n} tensors", size)
            for src, dst, tensor, size, n in merged.values()]


@dataclass
class _SvgLayout:
    """Where everything of the drawing goes. Columns: the plan's inputs, the segments layered
    by dependency (a producer left of its consumers), its outputs. Each edge leaves its source
    at the anchor of the tensor it carries and turns on a track in the gap after that column;
    an edge that skips columns runs along a band above the boxes and comes down in the gap
    before its target's column."""

    edges: list[tuple[str, str, str, int]]  # (source node, target node, tensor, bytes)
    layer: dict[str, int]  # node -> column
    ins: list[str]
    outs: list[str]
    sends: dict[str, list[str]]  # node -> the tensors it sends, one anchor each
    receives: dict[str, list[int]]  # node -> the edges arriving at it
    long_edges: list[int]
    band_top: int
    gap_tracks: dict[int, list[tuple[int, str]]]
    col_x: dict[int, float]
    col_w: dict[int, float]
    box: dict[str, tuple[float, float, float, float]]
    width: float
    height: float

    def out_anchor(self, node: str, tensor: str) -> tuple[float, float]:
        x0, y0, w, h = self.box[node]
        names = self.sends[node]
        return x0 + w, y0 + h * (names.index(tensor) + 1) / (len(names) + 1)

    def in_anchor(self, node: str, k: int) -> tuple[float, float]:
        x0, y0, w, h = self.box[node]
        ks = self.receives[node]
        return x0, y0 + h * (ks.index(k) + 1) / (len(ks) + 1)

    def track_x(self, gap: int, k: int, side: str) -> float:
        return self.col_x[gap] + self.col_w[gap] + LABEL_W + 8 + \
            self.gap_tracks[gap].index((k, side)) * TRACK_STEP


def _svg_layout(plan: dict[str, Any], segments: list[dict[str, Any]]) -> _SvgLayout:
    edges = _layout_edges(plan, {s["index"] for s in segments})
    layer: dict[str, int] = {}
    for seg in segments:  # segments run in order: a producer comes before its consumers
        node = f"seg{seg['index']}"
        layer[node] = 1 + max((layer[s] for s, d, *_ in edges if d == node and s in layer),
                              default=0)
    last = max(layer.values(), default=0) + 1
    ins = list(dict.fromkeys(s for s, *_ in edges if s.startswith("in:")))
    outs = list(dict.fromkeys(d for _, d, *_ in edges if d.startswith("out:")))
    for n in ins:
        layer[n] = 0
    for n in outs:
        layer[n] = last
    # each source node's anchors: one per tensor it sends (its label sits there)
    sends: dict[str, list[str]] = {}
    for src, _, tensor, _ in edges:
        if tensor not in sends.setdefault(src, []):
            sends[src].append(tensor)
    receives: dict[str, list[int]] = {}
    for k, (_, dst, _, _) in enumerate(edges):
        receives.setdefault(dst, []).append(k)
    long_edges = [k for k, (s, d, *_) in enumerate(edges) if layer[d] > layer[s] + 1]
    band_top = 56
    band_h = len(long_edges) * TRACK_STEP + 12
    top = band_top + band_h
    # tracks: every edge has one in the gap after its source's column, a long edge another in the
    # gap before its target's column
    gap_tracks: dict[int, list[tuple[int, str]]] = {}
    for k, (s, d, *_) in enumerate(edges):
        gap_tracks.setdefault(layer[s], []).append((k, "out"))
        if k in long_edges:
            gap_tracks.setdefault(layer[d] - 1, []).append((k, "in"))
    gap_w = {g: LABEL_W + max(len(t), 1) * TRACK_STEP + 16 for g, t in gap_tracks.items()}
    col_w = {c: (PORT_W if c in (0, last) else BOX_W) for c in range(last + 1)}
    col_x: dict[int, float] = {}
    x = 10.0
    for c in range(last + 1):
        col_x[c] = x
        x += col_w[c] + gap_w.get(c, 40)
    width = x - gap_w.get(last, 40) + 10
    # boxes and ports, stacked in their columns
    box: dict[str, tuple[float, float, float, float]] = {}
    heights: dict[int, float] = {}
    for node in ins + [f"seg{s['index']}" for s in segments] + outs:
        c = layer[node]
        rows = max(len(sends.get(node, ())), len(receives.get(node, ())), 1)
        h = max(4 * ROW_H + 14, rows * ROW_H + 10) if node.startswith("seg") else \
            max(rows * ROW_H, ROW_H + 4)
        y = top + heights.get(c, 0.0)
        box[node] = (col_x[c], y, col_w[c], h)
        heights[c] = heights.get(c, 0.0) + h + BOX_GAP
    height = top + max(heights.values(), default=0.0) + 30
    return _SvgLayout(edges, layer, ins, outs, sends, receives, long_edges, band_top,
                      gap_tracks, col_x, col_w, box, max(width, 520.0), height)


def to_svg(plan: dict[str, Any]) -> str:
    """The plan as an SVG drawing: a caption, then per stage of ``_svg_layout``'s drawing the
    edges (boundary tensors between segments bold and red), their labels, the input and output
    ports, and the segments."""
    segments = plan["segments"][:MAX_SEGMENTS]
    lay = _svg_layout(plan, segments)
    return "\n".join(_svg_caption(plan, segments, lay.width, lay.height) + _svg_edges(lay)
                     + _svg_labels(lay) + _svg_ports(lay) + _svg_segments(lay, segments)
                     + ["</svg>"]) + "\n"


def _svg_caption(plan: dict[str, Any], segments: list, width: float, height: float
                 ) -> list[str]:
    options = plan.get("options") or {}
    ops = [op["name"] for op in plan.get("ops", [])]
    caption = (f"fusion of {counted(len(ops), 'op')}: {', '.join(dict.fromkeys(ops[:12]))}"
               f"{', ...' if len(set(ops)) > 12 else ''}")
    settings = ", ".join(f"{k} {options[k]}" for k in ("segmenter", "time_limit_s", "device")
                         if k in options)
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica,Arial,sans-serif" '
            f'font-size="11">',
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
            'fill="#555"/></marker></defs>',
            f'<text class="caption" x="10" y="18" font-weight="bold">'
            f'{escape(_short(caption, width - 20))}</text>',
            f'<text class="caption" x="10" y="34">{escape(_short(settings, width - 20))}'
            f'{escape(_summary(plan, len(segments)))}</text>']


def _svg_edges(lay: _SvgLayout) -> list[str]:
    parts = []
    for k, (src, dst, tensor, size) in enumerate(lay.edges):
        x1, y1 = lay.out_anchor(src, tensor)
        x2, y2 = lay.in_anchor(dst, k)
        tx = lay.track_x(lay.layer[src], k, "out")
        if k in lay.long_edges:
            by = lay.band_top + lay.long_edges.index(k) * TRACK_STEP + 6
            ux = lay.track_x(lay.layer[dst] - 1, k, "in")
            points = [(x1, y1), (tx, y1), (tx, by), (ux, by), (ux, y2), (x2, y2)]
        else:
            points = [(x1, y1), (tx, y1), (tx, y2), (x2, y2)]
        crossing = src.startswith("seg") and dst.startswith("seg")
        colour = "#c0392b" if crossing else "#777"
        d = " ".join(f"{'M' if i == 0 else 'L'} {px:.1f} {py:.1f}"
                     for i, (px, py) in enumerate(points))
        parts.append(f'<path class="edge" data-from="{escape(src)}" data-to="{escape(dst)}" '
                     f'data-tensor="{escape(tensor)}" d="{d}" fill="none" stroke="{colour}" '
                     f'stroke-width="{2 if crossing else 1}" marker-end="url(#arrow)">'
                     f'<title>{escape(tensor)}: {human_bytes(size)}</title></path>')
    return parts


def _svg_labels(lay: _SvgLayout) -> list[str]:
    """One label per tensor a node sends, above its anchor."""
    parts = []
    for node, names in lay.sends.items():
        sizes = {t: s for src, _, t, s in lay.edges if src == node}
        for tensor in names:
            ax, ay = lay.out_anchor(node, tensor)
            parts.append(f'<text class="label" x="{ax + 4:.1f}" y="{ay - 3:.1f}">'
                         f'{escape(_short(f"{tensor} {human_bytes(sizes[tensor])}", LABEL_W))}'
                         f'</text>')
    return parts


def _svg_ports(lay: _SvgLayout) -> list[str]:
    parts = []
    for node in lay.ins + lay.outs:
        x0, y0, w, h = lay.box[node]
        parts.append(f'<rect class="port" data-node="{escape(node)}" x="{x0:.1f}" y="{y0:.1f}" '
                     f'width="{w}" height="{h:.1f}" fill="none" stroke="none"/>')
        text = _short(node.split(":", 1)[1], w - 4)
        if node.startswith("in:"):
            parts.append(f'<text x="{x0 + w - 4:.1f}" y="{y0 + h / 2 + 4:.1f}" '
                         f'text-anchor="end">{escape(text)}</text>')
        else:
            parts.append(f'<text x="{x0 + 4:.1f}" y="{y0 + h / 2 + 4:.1f}">{escape(text)}</text>')
    return parts


def _svg_segments(lay: _SvgLayout, segments: list[dict[str, Any]]) -> list[str]:
    parts = []
    for seg in segments:
        node = f"seg{seg['index']}"
        x0, y0, w, h = lay.box[node]
        colour = KIND_COLOURS.get(seg["kind"], "#ffffff")
        parts.append(f'<rect class="segment" data-node="{node}" x="{x0:.1f}" y="{y0:.1f}" '
                     f'width="{w}" height="{h:.1f}" rx="6" fill="{colour}" stroke="#333"/>')
        rows = [f"segment {seg['index']}: {seg['kind']}",
                f"{len(seg['ops'])} ops, {len(seg['recomputed_ops'])} recomputed",
                f"read {human_bytes(seg['read_bytes'])}",
                f"write {human_bytes(seg['write_bytes'])}"]
        for k, row in enumerate(rows):
            weight = ' font-weight="bold"' if k == 0 else ""
            parts.append(f'<text x="{x0 + 8:.1f}" y="{y0 + 18 + k * ROW_H:.1f}"{weight}>'
                         f'{escape(_short(row, w - 12))}</text>')
    return parts


def _summary(plan: dict[str, Any], drawn: int) -> str:
    n = len(plan["segments"])
    return "" if drawn == n else f"; the first {drawn} of {n} segments drawn"
