"""Finding the tanh-form GELU converters emit,
``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, for the gelu rewrite
(:mod:`coralrt._compile.rewrite.gelu`).  It is matched by value, not by
layout: from a TANH, the element-wise operators in front of it are evaluated
as a polynomial in a candidate x and must equal sqrt(2/pi) (x + 0.044715 x^3);
those behind it must equal 0.5 x + 0.5 x tanh.  Constants may sit on either
side, be scalars or one-element tensors, and be quantized (compared within
2 %).
"""

from __future__ import annotations

import math

__all__ = ["match_tanh_form"]

# The tanh-form GELU: sqrt(2/pi) * (x + 0.044715 x^3) goes into the TANH.
_TANH_GAIN = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715
_RTOL = 0.02                    # constants may be quantized
_POLY_OPS = ("MUL", "ADD", "SUB", "POW")


def _p_add(a: dict, b: dict, sign: float = 1.0) -> dict:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0.0) + sign * c
    return out


def _p_mul(a: dict, b: dict) -> dict:
    out: dict = {}
    for (i, j), c in a.items():
        for (k, m), d in b.items():
            out[(i + k, j + m)] = out.get((i + k, j + m), 0.0) + c * d
    return out


def _p_close(got: dict, want: dict) -> bool:
    size = max(abs(c) for c in want.values())
    for m in set(got) | set(want):
        g, w = got.get(m, 0.0), want.get(m, 0.0)
        if abs(g - w) > _RTOL * abs(w) + 1e-6 * size:
            return False
    return True


def _scalar_value(editor, t: int) -> float | None:
    """A one-element constant's value (dequantized when it is quantized), else None."""
    data = editor.const(t)
    if data is None or data.size != 1 or data.dtype.kind not in "iuf":
        return None
    value = float(data.reshape(-1)[0])
    q = editor.quant(t)
    if data.dtype.kind in "iu" and q is not None and q[0] > 0:
        value = q[0] * (value - q[1])
    return value


class _Trace:
    """Evaluates tensors as polynomials in ``leaves`` through MUL/ADD/SUB/POW with
    scalar constants, collecting the operators passed."""

    def __init__(self, editor, leaves: dict[int, tuple[int, int]]):
        self.editor, self.leaves = editor, leaves
        self.ops: set[int] = set()
        self.memo: dict[int, dict | None] = {}

    def poly(self, t: int, depth: int = 0) -> dict | None:
        if t in self.leaves:
            return {self.leaves[t]: 1.0}
        if t in self.memo:
            return self.memo[t]
        value = _scalar_value(self.editor, t)
        if value is not None:
            return {(0, 0): value}
        result = None
        i = self.editor.producer(t) if t >= 0 and depth < 12 else None
        if i is not None:
            result = self._op(i, depth)
        self.memo[t] = result
        return result

    def _op(self, i: int, depth: int) -> dict | None:
        op = self.editor.ops[i]
        if (op.name not in _POLY_OPS or len(op.inputs) != 2 or len(op.outputs) != 1
                or op.options.get("fused_activation_function", 0) not in (0, None)):
            return None
        a = self.poly(op.inputs[0], depth + 1)
        if a is None:
            return None
        if op.name == "POW":
            n = _scalar_value(self.editor, op.inputs[1])
            if n is None or abs(n - round(n)) > 1e-4 or not 1 <= round(n) <= 4:
                return None
            out = a
            for _ in range(round(n) - 1):
                out = _p_mul(out, a)
        else:
            b = self.poly(op.inputs[1], depth + 1)
            if b is None:
                return None
            out = _p_mul(a, b) if op.name == "MUL" else \
                _p_add(a, b, 1.0 if op.name == "ADD" else -1.0)
        self.ops.add(i)
        return out


def _sources(editor, t: int, limit: int = 24) -> list[int]:
    """Non-constant tensors behind ``t`` through MUL/ADD/SUB/POW, nearest first
    (at most ``limit``): the candidates for the pattern's x."""
    out, todo = [], [t]
    while todo and len(out) < limit:
        cur = todo.pop(0)
        i = editor.producer(cur) if cur >= 0 else None
        if i is None or editor.ops[i].name not in _POLY_OPS:
            continue
        for s in editor.ops[i].inputs:
            if s >= 0 and editor.const(s) is None and s not in out:
                out.append(s)
                todo.append(s)
    return out


def match_tanh_form(editor, i: int):
    """(operator indices, x, y) of a tanh-form GELU around TANH ``i``, or None."""
    op = editor.ops[i]
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        return None
    z, th = op.inputs[0], op.outputs[0]
    want_z = {(1, 0): _TANH_GAIN, (3, 0): _TANH_GAIN * _TANH_CUBIC}
    for x in _sources(editor, z):
        front = _Trace(editor, {x: (1, 0)})
        got = front.poly(z)
        if got is not None and _p_close(got, want_z):
            break
    else:
        return None
    want_y = {(1, 0): 0.5, (1, 1): 0.5}
    cur = th
    for _ in range(6):
        readers = editor.consumers(cur)
        if len(readers) != 1 or editor.is_output(cur):
            return None
        j = readers[0]
        if editor.ops[j].name not in _POLY_OPS or len(editor.ops[j].outputs) != 1:
            return None
        cur = editor.ops[j].outputs[0]
        back = _Trace(editor, {x: (1, 0), th: (0, 1)})
        got = back.poly(cur)
        if got is not None and _p_close(got, want_y):
            ops = front.ops | back.ops | {i}
            inside = [t for k in ops for t in editor.ops[k].outputs if t != cur]
            if all(editor.only_read_by(t, ops) for t in inside):
                return sorted(ops), x, cur
            return None
    return None
