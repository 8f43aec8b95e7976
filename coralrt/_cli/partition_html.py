"""Pictures of a partition: ``coralrt partition MODEL --html OUT.html / --svg OUT.svg``.

The operator graph, top to bottom (:mod:`coralrt._cli.graph_layout`), each
operator a box coloured by where it runs: one colour per Edge TPU segment,
one for the CPU, one for operators a plugin's CPU kernel runs.  A CPU
operator's reason is its box's tooltip (an SVG ``<title>``) and is also
written beside the graph on the operator's row (whole, wrapped over several
lines), because paper has no hover.  A reason that names what failed is shown
without edgetpu_compiler's status "...not mapped due to some unspecified
limitation" in front (the status stays in the tooltip and in the JSON).
Edges that carry a tensor between the host and the Edge TPU (across USB) are
drawn darker.

The picture itself is drawn by :mod:`coralrt._cli.partition_picture`; this
module puts the pages together.  The HTML page is self-contained XHTML (it
parses as XML): inline SVG and CSS, no script, no font or anything else
fetched.  The SVG file holds the same picture plus its tables as text.
Every string that comes from the model (operator codes, tensor names,
reasons quoting them) is escaped, and characters XML cannot carry at all
become U+FFFD.
"""

from __future__ import annotations

import textwrap

from coralrt._cli._text import size_str, table
from coralrt._cli.partition_picture import (
    CPU_COLOUR, FONT, MONO, PLUGIN_COLOUR, _Picture, _ranges, _tint, _x, segment_colour,
    shown_reason,
)
from coralrt._compile.partition import PartitionPlan, summary_lines
from coralrt._model.types import Model

__all__ = ["render_html", "render_svg", "shown_reason", "segment_colour", "CPU_COLOUR",
           "PLUGIN_COLOUR"]

# -- tables ------------------------------------------------------------------------------


def _segment_rows(pic: _Picture, estimates: dict | None) -> list[dict]:
    rows = []
    est = (estimates or {}).get("segments", {})
    for s in pic.plan.segments:
        e = est.get(s.index)
        rows.append({"index": s.index, "colour": segment_colour(s.index), "ops": len(s.ops),
                     "range": _ranges(sorted(s.ops)), "macs": s.macs,
                     "params": s.parameter_bytes, "on": s.on_chip_bytes,
                     "off": s.off_chip_bytes,
                     "ms": None if e is None else e["per_run_ms"],
                     "first": None if e is None else e["first_run_ms"]})
    return rows


def _estimate_note(plan: PartitionPlan, estimates: dict | None) -> str:
    if not plan.segments:
        return ""
    if not estimates:
        return "No latency estimate."
    text = (f"Estimated time per run on a Coral USB Accelerator ({estimates['usb']}, max "
            f"clock), from coralrt's latency model (the estimate coralrt bench and the "
            f"simulated stick use): an estimate, not a measurement. The first run also "
            f"uploads the segment's cached parameters. CPU operators are not estimated.")
    if estimates.get("note"):
        text += " " + estimates["note"]
    return text


def _ms(v) -> str:
    return "\u2013" if v is None else f"{v:.3f}"


def _cpu_rows(pic: _Picture) -> list[list]:
    return [[o.index, o.opcode, pic.placement_text(o.index), pic.reason(o.index)]
            for o in pic.plan.ops if o.unit == "cpu"]


def _summary(plan: PartitionPlan) -> list[str]:
    return summary_lines(plan.summary)


def render_svg(model: Model, plan: PartitionPlan, name: str, *, estimates: dict | None = None,
               plugin_ops: dict | None = None) -> str:
    """A standalone SVG: title, summary, legend, graph, segment and CPU tables."""
    pic = _Picture(model, plan, plugin_ops)
    top = [("h", f"Partition of {name} (mode {plan.mode})")]
    top += [("s", line) for line in _summary(plan)]
    bottom: list[tuple[str, str]] = [("h", "Edge TPU segments")]
    rows = [[r["index"], r["ops"], f"{r['macs']:,}", size_str(r["params"]),
             size_str(r["on"]), size_str(r["off"]), _ms(r["ms"]), _ms(r["first"])]
            for r in _segment_rows(pic, estimates)]
    if rows:
        text = table(["#", "ops", "MACs", "parameters", "on-chip", "off-chip",
                      "est. ms/run", "est. 1st run ms"], rows, right={0, 1, 2, 6, 7},
                     indent="")
        bottom += [("t", line) for line in text.splitlines()]
    else:
        bottom.append(("t", "none: every operator runs on the CPU"))
    bottom += [("t", line) for line in textwrap.wrap(_estimate_note(pic.plan, estimates), 110)]
    bottom.append(("h", "Operators on the CPU, and why"))
    groups: dict[str, list] = {}
    for i, opcode, _, reason in _cpu_rows(pic):
        groups.setdefault(reason, []).append((i, opcode))
    if not groups:
        bottom.append(("t", "none"))
    for reason, ops in groups.items():
        types = ", ".join(dict.fromkeys(opcode for _, opcode in ops))
        bottom.append(("b", f"{_ranges([i for i, _ in ops])} ({types})"))
        bottom += [("t", "    " + w) for w in textwrap.wrap(reason, 110)]
    svg = pic.svg(top_lines=top, bottom_lines=bottom)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n"


_CSS = f"""
body {{ font-family: {FONT}; color: #222; margin: 24px; }}
h1 {{ font-size: 20px; margin: 0 0 8px; }}
h2 {{ font-size: 16px; margin: 24px 0 8px; }}
p.note, ul.summary {{ font-size: 13px; color: #444; max-width: 1100px; }}
ul.summary {{ list-style: none; padding: 0; font-family: {MONO}; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f2f2f2; white-space: nowrap; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }}
td.code {{ font-family: {MONO}; font-size: 12px; }}
span.sw {{ display: inline-block; width: 14px; height: 12px; border: 1.5px solid;
          border-radius: 3px; vertical-align: -2px; margin-right: 6px; }}
div.graph {{ overflow-x: auto; border: 1px solid #ddd; margin-top: 8px; }}
@media print {{ div.graph {{ overflow: visible; border: none; }}
               div.graph svg {{ max-width: 100%; height: auto; }} }}
"""


def render_html(model: Model, plan: PartitionPlan, name: str, *,
                estimates: dict | None = None, plugin_ops: dict | None = None) -> str:
    """A self-contained XHTML page: summary, segment table, graph, CPU reasons,
    every operator."""
    pic = _Picture(model, plan, plugin_ops)
    title = f"Partition of {name} (mode {plan.mode})"
    h: list[str] = ['<?xml version="1.0" encoding="UTF-8"?>', "<!DOCTYPE html>",
                    '<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head>',
                    '<meta charset="utf-8"/>', f"<title>{_x(title)}</title>",
                    f"<style>{_CSS}</style></head><body>", f"<h1>{_x(title)}</h1>",
                    '<ul class="summary">']
    h += [f"<li>{_x(line)}</li>" for line in _summary(plan)]
    h.append("</ul>")
    h.append("<h2>Edge TPU segments</h2>")
    rows = _segment_rows(pic, estimates)
    if rows:
        h.append("<table><tr><th>segment</th><th>operators</th><th>MACs</th>"
                 "<th>parameters</th><th>on-chip</th><th>off-chip</th>"
                 "<th>est. time per run (ms)</th><th>est. first run (ms)</th></tr>")
        for r in rows:
            h.append(f'<tr><td><span class="sw" style="background:{_tint(r["colour"])};'
                     f'border-color:{r["colour"]}"></span>segment {r["index"]}</td>'
                     f'<td class="n">{r["ops"]} <span title="operator indices">'
                     f'({_x(r["range"])})</span></td><td class="n">{r["macs"]:,}</td>'
                     f'<td class="n">{_x(size_str(r["params"]))}</td>'
                     f'<td class="n">{_x(size_str(r["on"]))}</td>'
                     f'<td class="n">{_x(size_str(r["off"]))}</td>'
                     f'<td class="n">{_ms(r["ms"])}</td><td class="n">{_ms(r["first"])}</td>'
                     "</tr>")
        if len(rows) > 1 and all(r["ms"] is not None for r in rows):
            h.append(f'<tr><td>all segments</td><td class="n">{sum(r["ops"] for r in rows)}'
                     f'</td><td class="n">{sum(r["macs"] for r in rows):,}</td>'
                     f'<td class="n">{_x(size_str(sum(r["params"] for r in rows)))}</td>'
                     f'<td class="n">{_x(size_str(sum(r["on"] for r in rows)))}</td>'
                     f'<td class="n">{_x(size_str(sum(r["off"] for r in rows)))}</td>'
                     f'<td class="n">{sum(r["ms"] for r in rows):.3f}</td>'
                     f'<td class="n">{sum(r["first"] for r in rows):.3f}</td></tr>')
        h.append("</table>")
    else:
        h.append('<p class="note">None: every operator runs on the CPU.</p>')
    if plan.segments:
        h.append(f'<p class="note">{_x(_estimate_note(plan, estimates))}</p>')
    if plan.rewrites:
        h.append("<h2>Rewrites</h2>")
        h.append('<p class="note">Applied before partitioning (docs/rewrites.md); the '
                 "operator numbers on this page are those of the rewritten model.</p>")
        h.append("<ul>" + "".join(f"<li>{_x(r['line'])}</li>" for r in plan.rewrites) +
                 "</ul>")
    h.append("<h2>Operator graph</h2>")
    h.append('<p class="note">Top to bottom, from the model inputs. Each box is one operator '
             "(index, type, and where it runs: S<i>n</i> for Edge TPU segment <i>n</i>). "
             "Hover over a box for its tensors and reason, over an edge for its tensor. The "
             "reason each CPU operator stays on the CPU is written on its row, right of the "
             "graph, and in full below.</p>")
    h.append(f'<div class="graph">{pic.svg()}</div>')
    h.append("<h2>Operators on the CPU, and why</h2>")
    cpu = _cpu_rows(pic)
    if cpu:
        h.append("<table><tr><th>#</th><th>operator</th><th>runs on</th><th>reason</th></tr>")
        h += [f'<tr><td class="n">{i}</td><td class="code">{_x(opcode)}</td>'
              f'<td>{_x(where)}</td><td title="{_x(pic.status(i))}">{_x(reason)}</td></tr>'
              for i, opcode, where, reason in cpu]
        h.append("</table>")
    else:
        h.append('<p class="note">None: every operator runs on the Edge TPU.</p>')
    h.append("<h2>All operators</h2>")
    h.append("<table><tr><th>#</th><th>operator</th><th>runs on</th><th>status</th></tr>")
    for o in plan.ops:
        colour = pic.colour(o.index)
        h.append(f'<tr><td class="n">{o.index}</td><td class="code">{_x(o.opcode)}</td>'
                 f'<td><span class="sw" style="background:{_tint(colour)};'
                 f'border-color:{colour}"></span>{_x(pic.placement_text(o.index))}</td>'
                 f'<td title="{_x(pic.status(o.index))}">{_x(pic.reason(o.index))}</td></tr>')
    h.append("</table></body></html>")
    return "\n".join(h) + "\n"
