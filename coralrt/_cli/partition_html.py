"""Pictures of a partition: ``coralrt partition MODEL --html OUT.html / --svg OUT.svg``.

The operator graph, top to bottom (:mod:`coralrt._cli.graph_layout`), each
operator a box coloured by where it runs: one colour per Edge TPU segment,
one for the CPU, one for operators a plugin's CPU kernel runs.  A CPU
operator's reason is its box's tooltip (an SVG ``<title>``) and is also
written beside the graph on the operator's row (whole, wrapped over several
lines), because paper has no hover.  A reason that names what failed is shown
without edgetpu_compiler's status "...not mapped due to some unspecified
limitation" in front (the status stays in the tooltip and in the JSON).  Edges that carry a tensor
between the host and the Edge TPU (across USB) are drawn darker.

The HTML page is self-contained XHTML (it parses as XML): inline SVG and CSS,
no script, no font or anything else fetched.  The SVG file holds the same
picture plus its tables as text.  Every string that comes from the model
(operator codes, tensor names, reasons quoting them) is escaped, and
characters XML cannot carry at all become U+FFFD.
"""

from __future__ import annotations

import re
import textwrap
from html import escape

from coralrt._cli._text import size_str, table
from coralrt._cli.graph_layout import Layout, layout
from coralrt._compile.partition import PartitionPlan, summary_lines
from coralrt._compile.rules import UNSPECIFIED_LIMITATION
from coralrt._model.types import Model

__all__ = ["render_html", "render_svg", "segment_colour", "CPU_COLOUR", "PLUGIN_COLOUR"]

SEGMENT_COLOURS = ("#4e79a7", "#59a14f", "#b07aa1", "#76b7b2", "#9c755f", "#edc948",
                   "#ff9da7", "#17becf", "#bcbd22", "#8c6d31")
CPU_COLOUR = "#e15759"
PLUGIN_COLOUR = "#f28e2b"
EDGE = "#9a9a9a"
USB_EDGE = "#2b2b2b"

CHAR = 6.62           # width of one character of the 11 px monospace labels
BOX_H = 24
ROW_GAP = 26
NOTE_LINE = 14
NOTE_CHARS = 100      # a reason beside the graph wraps here
LABEL_CHARS = 30
PILL_CHARS = 22       # model input/output tensor names in the graph (the tooltip has them whole)
PILL_CHAR = 6.02      # width of one character of their 10 px monospace
MARGIN = 16
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"


def _x(text) -> str:
    """``text`` escaped for XML text and attribute values."""
    return escape(_NOT_XML.sub("\ufffd", str(text)), quote=True)


def shown_reason(reason: str) -> str:
    """``reason`` as the pictures show it: the detail alone when the reason is
    edgetpu_compiler's "unspecified limitation" status followed by what the
    limitation is; the status itself when it is all there is."""
    head = UNSPECIFIED_LIMITATION + ": "
    return reason[len(head):] if reason.startswith(head) and reason[len(head):].strip() \
        else reason


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "\u2026"


def _cut_middle(text: str, n: int, head: float = 0.5) -> str:
    if len(text) <= n:
        return text
    keep = round((n - 1) * head)
    return text[:keep] + "\u2026" + text[len(text) - (n - 1 - keep):]


def _abbreviate(names: list[str], n: int) -> list[str]:
    """``names`` cut to ``n`` characters in the middle, where the cut keeps them
    distinct if it can (``BoxPredictor_0/Bo…sAdd``, ``…ostProcess:1``)."""
    for head in (0.5, 0.75, 0.25, 0.9, 0.1):
        short = [_cut_middle(name, n, head) for name in names]
        if len(set(short)) == len(set(names)):
            return short
    return [_cut_middle(name, n) for name in names]


def segment_colour(k: int) -> str:
    if k < len(SEGMENT_COLOURS):
        return SEGMENT_COLOURS[k]
    # Beyond the palette: golden-angle hues, away from the CPU's red.
    hue = (200 + 137.508 * k) % 360
    hue = hue if not (340 <= hue or hue < 20) else (hue + 40) % 360
    return f"hsl({hue:.0f},45%,45%)"


def _tint(colour: str) -> str:
    if colour.startswith("hsl("):
        h, s, _ = colour[4:-1].split(",")
        return f"hsl({h},{s},88%)"
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * 0.75):02x}" for c in rgb)


def _ranges(indices: list[int]) -> str:
    """``#0-3, 7`` for [0, 1, 2, 3, 7]."""
    out, run = [], [indices[0]]
    for i in indices[1:]:
        if i == run[-1] + 1:
            run.append(i)
            continue
        out.append(run)
        run = [i]
    out.append(run)
    return "#" + ", ".join(f"{r[0]}\u2013{r[-1]}" if len(r) > 2 else
                           ", ".join(map(str, r)) for r in out)


def _tensor(model: Model, t: int) -> str:
    tensor = model.main.tensors[t]
    shape = "x".join(str(d) for d in tensor.shape) or "scalar"
    return f"{tensor.name} ({shape} {tensor.type_name.lower()})"


class _Picture:
    """Everything both renderers need: placements, colours, layout, rows."""

    def __init__(self, model: Model, plan: PartitionPlan, plugin_ops: dict | None):
        self.model, self.plan = model, plan
        sg = model.main
        self.plugin = {}
        for o in plan.ops:
            op = sg.operators[o.index]
            if o.unit == "cpu" and op.opcode.is_custom and (plugin_ops or {}).get(o.opcode):
                self.plugin[o.index] = plugin_ops[o.opcode]
        self.labels = {o.index: _cut(f"{o.index} {o.opcode}", LABEL_CHARS) for o in plan.ops}
        self.pills = {}
        for kind, tensors in (("in", sg.inputs), ("out", sg.outputs)):
            tensors = list(dict.fromkeys(tensors))
            names = _abbreviate([sg.tensors[t].name for t in tensors], PILL_CHARS)
            self.pills.update({(kind, t): name for t, name in zip(tensors, names)})

        def width(key):
            if key[0] == "op":
                o = plan.ops[key[1]]
                return round((len(self.labels[o.index]) + len(self.tag(o)) + 2) * CHAR + 14)
            return round(len(self.pill(key)) * PILL_CHAR + 20)

        self.lay: Layout = layout(sg, width)
        # Reasons beside the graph: per layer, CPU operators grouped by reason.
        self.notes: list[list[tuple[list[int], str]]] = []
        for nodes in self.lay.layers:
            groups: dict[str, list[int]] = {}
            for n in nodes:
                if n.key[0] == "op" and plan.ops[n.key[1]].unit == "cpu":
                    groups.setdefault(self.reason(n.key[1]), []).append(n.key[1])
            self.notes.append([(sorted(v), r) for r, v in groups.items()])
        self.tops, y = [], 0.0
        for notes in self.notes:
            self.tops.append(y)
            lines = sum(len(self.note(ix, r)) for ix, r in notes)
            y += max(BOX_H + ROW_GAP, lines * NOTE_LINE + 12)
        self.graph_h = y - ROW_GAP if self.tops else 0.0
        self.note_x = self.lay.width + 36
        note_chars = max([len(line) for ns in self.notes for ix, r in ns
                          for line in self.note(ix, r)] + [0])
        self.graph_w = self.note_x + note_chars * 6.3 if note_chars else self.lay.width

    def tag(self, o) -> str:
        return "plugin" if o.index in self.plugin else "CPU" if o.unit == "cpu" \
            else f"S{o.segment}"

    def reason(self, i: int) -> str:
        o = self.plan.ops[i]
        if i in self.plugin:
            return f"runs with the CPU kernel of plugin {self.plugin[i]}; {o.reason}"
        return shown_reason(o.reason)

    def status(self, i: int) -> str:
        """The reason as the partitioner gives it (edgetpu_compiler's status first)."""
        return self.plan.ops[i].reason

    def note(self, indices: list[int], reason: str) -> list[str]:
        """The lines written beside the graph for ``reason``: all of it, wrapped."""
        return textwrap.wrap(f"{_ranges(indices)}: {reason}", NOTE_CHARS,
                             subsequent_indent="  ", break_long_words=True)

    def colour(self, i: int) -> str:
        o = self.plan.ops[i]
        return PLUGIN_COLOUR if i in self.plugin else CPU_COLOUR if o.unit == "cpu" \
            else segment_colour(o.segment)

    def where(self, key) -> tuple:
        if key[0] != "op":
            return ("host",)
        o = self.plan.ops[key[1]]
        return ("host",) if o.unit == "cpu" else ("tpu", o.segment)

    def pill(self, key) -> str:
        return self.pills[key]

    def placement_text(self, i: int) -> str:
        o = self.plan.ops[i]
        if i in self.plugin:
            return f"CPU, kernel of plugin {self.plugin[i]}"
        return "CPU" if o.unit == "cpu" else f"Edge TPU segment {o.segment}"

    def legend(self) -> list[tuple[str, str]]:
        items = [(segment_colour(s.index), f"Edge TPU segment {s.index}")
                 for s in self.plan.segments]
        items.append((CPU_COLOUR, "CPU"))
        if self.plugin:
            items.append((PLUGIN_COLOUR, "CPU, a plugin's kernel"))
        return items

    # -- the SVG ------------------------------------------------------------------------

    def svg(self, *, top_lines: list[tuple[str, str]] = (),
            bottom_lines: list[tuple[str, str]] = ()) -> str:
        """The graph with its legend; ``top_lines`` / ``bottom_lines`` are
        (css class, text) lines written above / below it."""
        out: list[str] = []
        y = MARGIN
        for cls, text in top_lines:
            size = 16 if cls == "h" else 12
            y += size + 4
            out.append(f'<text x="{MARGIN}" y="{y}" class="{cls}" xml:space="preserve">'
                       f'{_x(text)}</text>')
        width = max(self.graph_w + 2 * MARGIN, 760,
                    max([len(t) * 7.0 + 2 * MARGIN for _, t in (*top_lines, *bottom_lines)]
                        + [0]))
        y += 10
        y = self._legend(out, y, width - MARGIN)
        gy = y + 24
        gx = MARGIN
        self._edges(out, gx, gy)
        self._nodes(out, gx, gy)
        y = gy + self.graph_h + 28
        for cls, text in bottom_lines:
            y += {"h": 34, "b": 20}.get(cls, 15)
            out.append(f'<text x="{MARGIN}" y="{y}" class="{cls}" xml:space="preserve">'
                       f'{_x(text)}</text>')
        height = y + MARGIN
        style = (f"text{{font-family:{FONT};font-size:12px;fill:#222}}"
                 f".lbl,.tag,.pill,.t,.b{{font-family:{MONO}}}"
                 ".lbl{font-size:11px}.pill{font-size:10px;fill:#444}.tag{font-size:10px;font-weight:bold}"
                 ".note{font-size:11px;fill:#7a1f20}.h{font-size:16px;font-weight:bold}"
                 ".t,.b{font-size:11px;white-space:pre}.b{font-weight:bold}.s{font-size:12px;white-space:pre}"
                 "g.op:hover rect{stroke-width:2.5}")
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
                f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
                f'role="img" aria-label="operator graph">'
                f'<style>{style}</style>'
                '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" '
                'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                f'<path d="M0,0 L8,4 L0,8 z" fill="{EDGE}"/></marker>'
                '<marker id="arrow-usb" viewBox="0 0 8 8" refX="7" refY="4" '
                'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                f'<path d="M0,0 L8,4 L0,8 z" fill="{USB_EDGE}"/></marker></defs>'
                f'<rect width="100%" height="100%" fill="#ffffff"/>'
                + "".join(out) + "</svg>")

    def _legend(self, out: list[str], y: float, limit: float) -> float:
        x, row_h = MARGIN, 20
        y += 4
        items = [("box", c, t) for c, t in self.legend()]
        items += [("pill", "#777777", "model input or output (tensor name)"),
                  ("line", EDGE, "tensor passed on the same side"),
                  ("line", USB_EDGE, "tensor crossing USB (host \u2194 Edge TPU)")]
        for kind, colour, text in items:
            w = 26 + len(text) * 7.0 + 18
            if x + w > limit and x > MARGIN:
                x, y = MARGIN, y + row_h
            if kind == "box":
                out.append(f'<rect x="{x}" y="{y}" width="18" height="13" rx="3" '
                           f'fill="{_tint(colour)}" stroke="{colour}" stroke-width="1.5"/>')
            elif kind == "pill":
                out.append(f'<rect x="{x}" y="{y}" width="18" height="13" rx="6.5" '
                           f'fill="#ffffff" stroke="{colour}"/>')
            else:
                out.append(f'<line x1="{x}" y1="{y + 7}" x2="{x + 18}" y2="{y + 7}" '
                           f'stroke="{colour}" stroke-width="{1.8 if colour == USB_EDGE else 1.2}"/>')
            out.append(f'<text x="{x + 24}" y="{y + 11}">{_x(text)}</text>')
            x += w
        return y + row_h

    def _edges(self, out: list[str], gx: float, gy: float) -> None:
        nodes = self.lay.nodes
        for e in self.lay.edges:
            src, dst = nodes[e.src], nodes[e.dst]
            pts = [(gx + src.center, gy + self.tops[src.layer] + BOX_H)]
            for via in e.route:
                v = nodes[via]
                top = gy + self.tops[v.layer]
                pts += [(gx + v.center, top), (gx + v.center, top + BOX_H)]
            pts.append((gx + dst.center, gy + self.tops[dst.layer]))
            d = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
            for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
                if x0 == x1:
                    d.append(f"L{x1:.1f},{y1:.1f}")
                else:
                    m = (y1 - y0) / 2
                    d.append(f"C{x0:.1f},{y0 + m:.1f} {x1:.1f},{y1 - m:.1f} {x1:.1f},{y1:.1f}")
            usb = self.where(e.src) != self.where(e.dst)
            colour, marker = (USB_EDGE, "arrow-usb") if usb else (EDGE, "arrow")
            title = "; ".join(_tensor(self.model, t) for t in e.tensors)
            if usb:
                title += " (crosses USB)"
            out.append(f'<g class="edge"><title>{_x(title)}</title><path d="{" ".join(d)}" '
                       f'fill="none" stroke="{colour}" stroke-width="{1.7 if usb else 1.1}" '
                       f'marker-end="url(#{marker})"/></g>')

    def _nodes(self, out: list[str], gx: float, gy: float) -> None:
        sg = self.model.main
        notes_x = gx + self.note_x
        for li, notes in enumerate(self.notes):   # leaders first: boxes cover them
            for k, (indices, _) in enumerate(notes):
                ny = gy + self.tops[li] + 4 + self._note_row(li, k) * NOTE_LINE + NOTE_LINE / 2
                for i in indices:
                    n = self.lay.nodes[("op", i)]
                    out.append(f'<line x1="{gx + n.x + n.width:.1f}" '
                               f'y1="{gy + self.tops[li] + BOX_H / 2:.1f}" '
                               f'x2="{notes_x - 6:.1f}" y2="{ny:.1f}" stroke="{CPU_COLOUR}" '
                               f'stroke-opacity="0.45" stroke-dasharray="2,3"/>')
        for n in self.lay.nodes.values():
            if n.virtual:
                continue
            x, y = gx + n.x, gy + self.tops[n.layer]
            if n.key[0] != "op":
                t = n.key[1]
                title = f"model {'input' if n.key[0] == 'in' else 'output'} " \
                        f"{_tensor(self.model, t)}"
                out.append(f'<g class="io"><title>{_x(title)}</title>'
                           f'<rect x="{x:.1f}" y="{y + 2}" width="{n.width:.1f}" '
                           f'height="{BOX_H - 4}" rx="10" fill="#ffffff" stroke="#777"/>'
                           f'<text x="{x + 9:.1f}" y="{y + 16}" class="pill">'
                           f'{_x(self.pill(n.key))}</text></g>')
                continue
            i = n.key[1]
            o = self.plan.ops[i]
            op = sg.operators[i]
            colour = self.colour(i)
            lines = [f"#{i} {o.opcode}: {self.placement_text(i)}"]
            if o.unit == "cpu":
                lines.append(self.reason(i))
                if self.status(i) != self.reason(i) and i not in self.plugin:
                    lines.append(f"(edgetpu_compiler status: {self.status(i)})")
            lines += ["inputs: " + ", ".join(_tensor(self.model, t) for t in op.inputs
                                             if t >= 0 and not sg.tensors[t].is_constant),
                      "outputs: " + ", ".join(_tensor(self.model, t) for t in op.outputs
                                              if t >= 0)]
            out.append(f'<g class="op" id="op{i}"><title>{_x(chr(10).join(lines))}</title>'
                       f'<rect x="{x:.1f}" y="{y}" width="{n.width}" height="{BOX_H}" rx="4" '
                       f'fill="{_tint(colour)}" stroke="{colour}" stroke-width="1.5"/>'
                       f'<text x="{x + 7:.1f}" y="{y + 16}" class="lbl">'
                       f'{_x(self.labels[i])}</text>'
                       f'<text x="{x + n.width - 7:.1f}" y="{y + 16}" class="tag" '
                       f'text-anchor="end" fill="{colour}">{_x(self.tag(o))}</text></g>')
        for li, notes in enumerate(self.notes):
            for k, (indices, reason) in enumerate(notes):
                row = self._note_row(li, k)
                for j, line in enumerate(self.note(indices, reason)):
                    ny = gy + self.tops[li] + 4 + (row + j) * NOTE_LINE + NOTE_LINE / 2 + 4
                    out.append(f'<text x="{notes_x:.1f}" y="{ny:.1f}" class="note" '
                               f'xml:space="preserve"><title>{_x(reason)}</title>'
                               f'{_x(line)}</text>')

    def _note_row(self, layer: int, k: int) -> int:
        """The line on which note ``k`` of ``layer`` starts (earlier notes may wrap)."""
        return sum(len(self.note(ix, r)) for ix, r in self.notes[layer][:k])


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
