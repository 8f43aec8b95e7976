"""``coralrt partition --html/--svg``: well-formed, complete, escaped pictures."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import numpy as np
import pytest
from conftest import shared_model

from coralrt._cli.main import main
from coralrt._cli.partition_cmd import segment_estimates
from coralrt._cli.partition_html import shown_reason, render_html, render_svg
from coralrt._compile.partition import partition
from coralrt import load_model
from coralrt.testing import ModelBuilder

X = "{http://www.w3.org/1999/xhtml}"
S = "{http://www.w3.org/2000/svg}"
NASTY = "<script>alert('x')</script> & \"q\""


class _Strict(HTMLParser):
    """html.parser, with every start tag matched by its end tag."""

    VOID = {"meta", "br", "img", "link", "hr", "input"}

    def __init__(self):
        super().__init__()
        self.stack = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()


def _parse(text: str) -> ET.Element:
    root = ET.fromstring(text.encode("utf-8"))   # strict: XHTML / SVG must be well-formed XML
    if root.tag == f"{X}html":
        p = _Strict()
        p.feed(text)
        p.close()
        assert p.stack == []
    return root


def _text(root: ET.Element) -> str:
    return "\n".join(root.itertext())


def _cells(root: ET.Element, heading: str) -> list[list[str]]:
    """The rows (cell texts) of the table after the <h2> ``heading``."""
    body = root.find(f"{X}body")
    kids = list(body)
    at = next(k for k, e in enumerate(kids) if e.tag == f"{X}h2" and e.text == heading)
    table = next(e for e in kids[at:] if e.tag == f"{X}table")
    return [["".join(td.itertext()) for td in tr] for tr in table.iter(f"{X}tr")][1:]


@pytest.mark.parametrize("mode", ["multi", "compat"])
def test_deeplab_page_names_every_operator_reason_and_segment(tmp_path, capsys, mode):
    path = shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")
    out, svg = tmp_path / "p.html", tmp_path / "p.svg"
    assert main(["partition", str(path), "--mode", mode]) == 0
    plain = capsys.readouterr().out
    assert main(["partition", str(path), "--mode", mode, "--html", str(out),
                 "--svg", str(svg)]) == 0
    assert capsys.readouterr().out == plain        # the text output is unchanged
    plan = partition(load_model(path), mode)
    page = out.read_text("utf-8")
    root = _parse(page)
    assert "http" not in page.replace("http://www.w3.org/", "")   # nothing fetched
    assert "<script" not in page
    graph = root.find(f".//{S}svg")
    labels = {t.text for t in graph.iter(f"{S}text")}
    for o in plan.ops:
        assert f"{o.index} {o.opcode}" in labels                 # in the graph
    rows = _cells(root, "All operators")
    assert [(int(r[0]), r[1]) for r in rows] == [(o.index, o.opcode) for o in plan.ops]
    cpu = _cells(root, "Operators on the CPU, and why")
    assert [(int(r[0]), r[3]) for r in cpu] == [(o.index, shown_reason(o.reason))
                                                for o in plan.ops if o.unit == "cpu"]
    titles = [t.text for t in graph.iter(f"{S}title")]
    for o in plan.ops:
        if o.unit == "cpu":                                   # on hover too
            assert any(o.reason in t for t in titles)
    segs = _cells(root, "Edge TPU segments")
    assert len(plan.segments) >= 1
    for s in plan.segments:
        row = next(r for r in segs if r[0] == f"segment {s.index}")
        assert row[1].startswith(f"{len(s.ops)} ")
        assert float(row[6]) > 0                                # the estimate
        assert f"Edge TPU segment {s.index}" in labels          # the legend
    assert "estimate, not a measurement" in _text(root)
    standalone = _parse(svg.read_text("utf-8"))
    text = _text(standalone)
    for o in plan.ops:
        assert f"{o.index} {o.opcode}" in text
    assert "Edge TPU segments" in text and "Operators on the CPU, and why" in text


def test_estimates_are_the_simulated_sticks(tmp_path):
    """The per-segment estimate is what the simulated stick reports for the same run."""
    from coralrt._compile.cache import CompileCache
    from coralrt._session import InferenceSession
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    model = load_model(path)
    est = segment_estimates(model, partition(model, "multi"))
    sess = InferenceSession(str(path), target="sim", cache=CompileCache(tmp_path))
    feed = {i.name: np.zeros(i.shape, i.dtype) for i in sess.get_inputs()}
    sess.run(feed)
    sess.run(feed)
    device = [s["device_seconds"] for s in sess.profile() if s["kind"] == "tpu"]
    sess.close()
    assert [round(e["per_run_ms"], 6) for e in est["segments"].values()] == \
        [round(d * 1e3, 6) for d in device]


def _nasty_model():
    b = ModelBuilder()
    x = b.input(NASTY + " in", (1, 8), np.uint8, scale=0.1, zero_point=0)
    c = b.constant("c&<b>", np.ones((1, 8), np.uint8), scale=0.1, zero_point=0)
    y = b.tensor("sum</title><script>", (1, 8), np.uint8, scale=0.2, zero_point=0)
    b.op("ADD", [x, c], [y])
    z = b.tensor(NASTY + " out", (1, 8), np.uint8, scale=0.2, zero_point=0)
    b.op("<script>&amp;\"op\x01'", [y], [z])
    b.output(z)
    return b.build()


@pytest.mark.parametrize("render", [render_html, render_svg])
def test_model_strings_are_escaped(render):
    model = _nasty_model()
    plan = partition(model, "multi")
    out = render(model, plan, "<b>&name.tflite", plugin_ops={})
    assert "<script" not in out and "<b>" not in out
    root = _parse(out)
    text = _text(root)
    titles = "\n".join(t.text or "" for t in root.iter(f"{S}title"))
    assert "\x01" not in out                          # no character XML cannot carry
    assert NASTY + " in" in titles and "sum</title><script>" in titles
    assert "<script>&amp;\"op\ufffd'" in text + titles
    assert "<b>&name.tflite" in text
    cpu = [o for o in plan.ops if o.unit == "cpu"]
    assert cpu and all(o.reason.replace("\x01", "\ufffd") in text + titles for o in cpu)


def test_plugin_kernel_operators_are_marked():
    model = _nasty_model()
    plan = partition(model, "multi")
    op = next(o for o in plan.ops if o.opcode.startswith("<script>"))
    out = render_html(model, plan, "m", plugin_ops={op.opcode: "my_plugin"})
    assert "CPU, kernel of plugin my_plugin" in _text(_parse(out))


def test_cpu_reasons_are_whole_and_without_the_contradicting_prefix(tmp_path):
    """DeepLab's RESIZE_BILINEAR names its limitation: the picture writes that reason whole
    (wrapped, never cut mid-word) and without "unspecified limitation" in front; the status
    stays in the tooltip.  ARG_MAX keeps its own status, which is the reason."""
    import xml.etree.ElementTree as ET
    from conftest import shared_model
    from coralrt._cli.main import main
    svg, html = tmp_path / "d.svg", tmp_path / "d.html"
    assert main(["partition", str(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")),
                 "--svg", str(svg), "--html", str(html)]) == 0
    ns = "{http://www.w3.org/2000/svg}"
    notes = [t for t in ET.parse(svg).iter(f"{ns}text") if t.get("class") == "note"]
    lines = ["".join(t.itertext()).replace(t.findtext(f"{ns}title") or "", "", 1)
             for t in notes]
    text = " ".join(x.strip() for x in lines)
    assert "#64: resizing height 1 -> 33 with align_corners has no exact integer ratio, so " \
           "the Edge TPU would lose precision" in text
    assert "#71: Operation not supported: the Edge TPU has no ARG_MAX operator" in text
    assert "unspecified limitation" not in text and "\u2026" not in text
    page = html.read_text(encoding="utf-8")
    root = _parse(page)
    shown = [t for e in root.iter() if not e.tag.endswith("title")
             for t in (e.text, e.tail) if t]                  # what is read without hovering
    assert not any("unspecified limitation: resizing" in t for t in shown)
    assert any(t == "resizing height 1 -> 33 with align_corners has no exact integer ratio, "
                    "so the Edge TPU would lose precision" for t in shown)
    assert 'title="Operation is otherwise supported, but not mapped due to some unspecified ' \
           'limitation: resizing height 1 -&gt; 33' in page
