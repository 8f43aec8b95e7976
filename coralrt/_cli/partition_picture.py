"""The picture of a partition that ``coralrt partition --html/--svg`` draws: the
operator graph top to bottom (:mod:`coralrt._cli.graph_layout`), each
operator a box coloured by where it runs, a CPU operator's reason beside it,
as SVG (:class:`_Picture`), with the colours and text helpers the pages share
(:mod:`coralrt._cli.partition_html` assembles the pages around it).
"""

from __future__ import annotations

import re
import textwrap
from html import escape

from coralrt._cli.graph_layout import Layout, layout
from coralrt._compile.partition import PartitionPlan
from coralrt._compile.rules import UNSPECIFIED_LIMITATION
from coralrt._model.types import Model

__all__ = ["segment_colour", "shown_reason", "CPU_COLOUR", "PLUGIN_COLOUR"]

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
