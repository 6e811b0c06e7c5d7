"""The dashboard page: recent plans with their bytes against greedy and the lower bound, and a
picture of their segments. Self-contained HTML (inline CSS and SVG, no CDN, no script).

Rendered in a planner process (``render_recent``), which reads the plans from the store itself:
with a 20,000-op plan among them, loading and drawing took 1.5-2.4 s, which on the event loop
stalled every other request.
"""

from __future__ import annotations

from html import escape
from typing import Any

from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.plan.render import human_bytes, to_svg
from fusecut.service.cache.store import read_recent

STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 15px; margin-bottom: 4px; }
.plan { border: 1px solid #ccc; border-radius: 6px; padding: 12px; margin: 12px 0; }
.bars { width: 480px; } .bar { height: 14px; margin: 3px 0; font-size: 11px; color: #fff;
  padding-left: 4px; white-space: nowrap; }
.fusecut { background: #2c7be5; } .greedy { background: #e5632c; } .floor { background: #39a845; }
.meta { font-size: 12px; color: #555; } .svg { overflow-x: auto; }
.id { font-size: 11px; font-weight: normal; color: #888; font-family: monospace; }
.options { font-size: 12px; color: #333; font-family: monospace; margin-bottom: 4px; }
"""


def render_recent(location: str, n: int, worker: dict[str, Any]) -> str | None:
    """The page of the ``n`` newest plans in the cache at ``location`` (None if it cannot be
    read from here)."""
    plans = read_recent(location, n)
    return None if plans is None else render(plans, worker)


def render(plans: list[tuple[dict[str, Any], str | None]], worker: dict[str, Any]) -> str:
    """The page for ``plans``: (plan JSON, the name of the definition function that made it)."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>fusecut</title>",
             f"<style>{STYLE}</style></head><body>", "<h1>fusecut: recent plans</h1>",
             f"<p class='meta'>worker: {escape(str(worker.get('device')))}, "
             f"{'up' if worker.get('up') else 'down'}; {len(plans)} plan(s) shown</p>"]
    if not plans:
        parts.append("<p>No plans yet: POST a definition to /v1/plan.</p>")
    for plan, name in plans:
        tot, base = plan["totals"], plan["baseline"]
        top = max(base["io_bytes"], tot["io_bytes"], tot["lower_bound_bytes"], 1)

        kinds = ", ".join(s["kind"] for s in plan["segments"])
        parts += ["<div class='plan'>",
                  f"<h2>{escape(fusion_title(plan, name))} "
                  f"<span class='id'>plan {escape(plan['plan_id'])}</span></h2>",
                  f"<div class='options'>{escape(options_text(plan['options']))}</div>",
                  f"<div class='meta'>fusion {escape(plan['fusion_id'][:16])}&hellip;, "
                  f"{escape(plan['segmenter'])} ({escape(plan['solver']['status'])}), "
                  f"{len(plan['segments'])} segment(s): {escape(kinds)}; io_ratio "
                  f"{tot['io_ratio']:.3f}; saved {human_bytes(base['io_bytes'] - tot['io_bytes'])}"
                  f" against greedy</div>",
                  "<div class='bars'>", _bar("fusecut", "fusecut", tot["io_bytes"], top),
                  _bar("greedy", "greedy", base["io_bytes"], top),
                  _bar("floor", "lower bound", tot["lower_bound_bytes"], top), "</div>",
                  f"<div class='svg'>{to_svg(plan)}</div>", "</div>"]
    parts.append("</body></html>")
    return "\n".join(parts)


FIRST_OPS = 4


def fusion_title(plan: dict[str, Any], name: str | None) -> str:
    """What a person recognises a fusion by: its definition function's name, or (for a wire-JSON
    definition, which has none) its first kinds of op."""
    ops = plan["ops"]
    count = f"{len(ops)} op{'s' if len(ops) != 1 else ''}"
    if name:
        return f"{name} ({count})"
    names = list(dict.fromkeys(op["name"] for op in ops))
    more = ", ..." if len(names) > FIRST_OPS else ""
    return f"{', '.join(names[:FIRST_OPS])}{more} ({count})"


def options_text(options: dict[str, Any]) -> str:
    """The options a plan was made with, on one line (kinds: "all" unless some were left out)."""
    shown = []
    for key, value in options.items():
        if key == "kinds":
            value = "all" if set(value) >= {k.value for k in Kind} else "/".join(value)
        elif key == "device_overrides":
            if not value:
                continue
            value = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in sorted(value.items()))
            value = "{" + value + "}"
        elif isinstance(value, float):
            value = f"{value:g}"
        shown.append(f"{key}={value}")
    return "options: " + " · ".join(shown)


def _bar(cls: str, label: str, value: int, top: int) -> str:
    width = max(2.0, 100.0 * value / top)
    return (f"<div class='bar {cls}' style='width:{width:.1f}%'>{escape(label)} "
            f"{human_bytes(value)}</div>")
