"""A layered top-to-bottom layout of a model's operator graph, for pictures.

Nodes are the operators plus one node per model input and output tensor.
Layers follow the longest path from the inputs; an edge spanning several
layers passes through one small virtual node per layer in between, so that
it gets its own lane instead of running through the boxes it skips
(Sugiyama's method).  The order inside a layer comes from barycenter sweeps
(the best order seen, by edge crossings), the x positions from repeatedly
pulling every node towards the mean of its neighbours while keeping the
layer's order and spacing (blocks of touching nodes move together).

Only positions come out of here: what the nodes look like is the renderer's
business (:mod:`coralrt._cli.partition_html`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coralrt._model.types import Subgraph

__all__ = ["Node", "Edge", "Layout", "layout"]

GAP = 16          # horizontal space between neighbouring nodes
LANE = 10         # width of the lane a long edge takes in a layer it crosses


@dataclass
class Node:
    key: tuple              # ("op", index) | ("in", tensor) | ("out", tensor) | ("via", n)
    layer: int
    width: float
    x: float = 0.0          # left edge
    order: int = 0

    @property
    def center(self) -> float:
        return self.x + self.width / 2

    @property
    def virtual(self) -> bool:
        return self.key[0] == "via"


@dataclass
class Edge:
    src: tuple              # node keys of the real ends
    dst: tuple
    tensors: list[int]      # the tensors this edge carries (usually one)
    route: list[tuple] = field(default_factory=list)   # virtual node keys, top to bottom


@dataclass
class Layout:
    nodes: dict[tuple, Node]
    edges: list[Edge]
    layers: list[list[Node]]

    @property
    def width(self) -> float:
        return max((n.x + n.width for n in self.nodes.values()), default=0.0)


def layout(sg: Subgraph, widths) -> Layout:
    """The layout of ``sg``; ``widths(key)`` gives each real node's width."""
    producer = {t: i for i, op in enumerate(sg.operators) for t in op.outputs if t >= 0}
    inputs = list(dict.fromkeys(sg.inputs))
    pairs: dict[tuple, list[int]] = {}       # (src, dst) -> tensors
    for i, op in enumerate(sg.operators):
        for t in op.inputs:
            if t in producer:
                src = ("op", producer[t])
            elif t in inputs:
                src = ("in", t)
            else:
                continue    # a constant or an omitted optional input
            pairs.setdefault((src, ("op", i)), [])
            if t not in pairs[(src, ("op", i))]:
                pairs[(src, ("op", i))].append(t)
    for t in dict.fromkeys(sg.outputs):
        src = ("op", producer[t]) if t in producer else ("in", t) if t in inputs else None
        if src is not None:
            pairs[(src, ("out", t))] = [t]

    layer: dict[tuple, int] = {("in", t): 0 for t in inputs}
    preds: dict[tuple, list[tuple]] = {}
    for src, dst in pairs:
        preds.setdefault(dst, []).append(src)
    for i in range(len(sg.operators)):   # TFLite's operator order is a topological order
        key = ("op", i)
        layer[key] = max((layer[p] + 1 for p in preds.get(key, ()) if p in layer), default=0)
    for t in dict.fromkeys(sg.outputs):
        key = ("out", t)
        if key in preds:
            layer[key] = max(layer[p] for p in preds[key]) + 1

    nodes = {k: Node(k, lay, float(widths(k))) for k, lay in layer.items()}
    edges = []
    for (src, dst), tensors in pairs.items():
        e = Edge(src, dst, tensors)
        for lay in range(layer[src] + 1, layer[dst]):
            via = ("via", len(nodes))
            nodes[via] = Node(via, lay, LANE)
            e.route.append(via)
        edges.append(e)
    layers: list[list[Node]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for n in nodes.values():
        layers[n.layer].append(n)
    up, down = _links(edges)
    _order(layers, up, down)
    _place(layers, up, down, nodes)
    return Layout(nodes, edges, layers)


def _links(edges: list[Edge]) -> tuple[dict, dict]:
    """Neighbours in the layer above (``up``) and below (``down``) of every node."""
    up: dict[tuple, list[tuple]] = {}
    down: dict[tuple, list[tuple]] = {}
    for e in edges:
        chain = [e.src, *e.route, e.dst]
        for a, b in zip(chain, chain[1:]):
            down.setdefault(a, []).append(b)
            up.setdefault(b, []).append(a)
    return up, down


def _crossings(layers, down, pos: dict) -> int:
    total = 0
    for upper in layers[:-1]:
        ends = sorted((pos[n.key], pos[k]) for n in upper for k in down.get(n.key, ()))
        total += sum(1 for a in range(len(ends)) for b in range(a + 1, len(ends))
                     if ends[a][0] < ends[b][0] and ends[a][1] > ends[b][1])
    return total


def _order(layers, up, down) -> None:
    pos: dict[tuple, int] = {}

    def number(lay) -> None:
        for k, n in enumerate(lay):
            n.order = pos[n.key] = k

    for lay in layers:
        number(lay)
    best, best_cost = [list(lay) for lay in layers], _crossings(layers, down, pos)
    for sweep in range(8):
        links, rng = (up, range(1, len(layers))) if sweep % 2 == 0 else \
            (down, range(len(layers) - 2, -1, -1))
        for li in rng:
            def bary(n):
                near = links.get(n.key)
                return sum(pos[k] for k in near) / len(near) if near else n.order
            layers[li].sort(key=lambda n: (bary(n), n.order))
            number(layers[li])
        cost = _crossings(layers, down, pos)
        if cost < best_cost:
            best, best_cost = [list(lay) for lay in layers], cost
    layers[:] = best
    for lay in layers:
        number(lay)


def _place(layers, up, down, nodes) -> None:
    for lay in layers:
        x = 0.0
        for n in lay:
            n.x = x
            x += n.width + GAP
    both = {k: up.get(k, []) + down.get(k, []) for k in nodes}
    # Sweeps down (towards the parents) and up (towards the children), then
    # both ways at once, which settles a node between its parents and children.
    # The last sweep goes down towards the parents: a chain ends up straight.
    for sweep in range(17):
        links = up if sweep % 2 == 0 else down
        rng = range(len(layers)) if sweep % 2 == 0 else range(len(layers) - 1, -1, -1)
        if 8 <= sweep < 16:
            links = both
        for li in rng:
            want = []
            for n in layers[li]:
                near = [nodes[k] for k in links.get(n.key, ())]
                weights = [_weight(m) for m in near]
                want.append(sum(w * m.center for w, m in zip(weights, near)) / sum(weights)
                            if near else n.center)
            _pack(layers[li], want)
    left = min((n.x for n in nodes.values()), default=0.0)
    for n in nodes.values():
        n.x -= left


def _weight(n: Node) -> float:
    # A lane yields to a box: boxes stay in line with the boxes they connect
    # to, and the long edges bend around them.
    return 0.05 if n.virtual else 1.0


def _pack(lay: list[Node], want: list[float]) -> None:
    """Left edges for ``lay`` (kept in order, ``GAP`` apart at least) as close as
    possible, in weighted squares, to centres ``want``: blocks of nodes that
    would overlap are merged and placed at their members' weighted mean wish."""
    blocks: list[list] = []   # [start index, end index, offset-free left edge, weight]
    offsets, acc = [], 0.0
    for n in lay:
        offsets.append(acc)
        acc += n.width + GAP
    for k, n in enumerate(lay):
        weight = _weight(n)
        blocks.append([k, k + 1, want[k] - n.width / 2 - offsets[k], weight])
        while len(blocks) > 1 and blocks[-2][2] > blocks[-1][2] - 1e-9:
            b = blocks.pop()
            a = blocks[-1]
            a[2] = (a[2] * a[3] + b[2] * b[3]) / (a[3] + b[3])
            a[1], a[3] = b[1], a[3] + b[3]
    for start, end, base, _ in blocks:
        for k in range(start, end):
            lay[k].x = base + offsets[k]
