"""Plain text shared by the commands: aligned tables and numbers out, whole numbers in."""

from __future__ import annotations

import argparse
import json
import math
import re

__all__ = ["table", "shape_str", "size_str", "num", "json_num", "dumps", "plural",
           "whole_number"]

# A list of numbers as json.dumps(indent=...) lays it out: one per line.  JSON
# strings cannot hold a raw newline, so this never matches inside a name.
_NUMBER_LIST = re.compile(r"\[\n\s*(-?[\d.eE+-]+(?:,\n\s*-?[\d.eE+-]+)*)\n\s*\]")


def table(headers: list[str] | None, rows: list[list], *, indent: str = "  ",
          right: set[int] | frozenset[int] = frozenset()) -> str:
    """Rows aligned in columns under ``headers`` (None: no header line);
    column indices in ``right`` are right-aligned (numbers)."""
    cells = [] if headers is None else [[str(c) for c in headers]]
    cells += [[str(c) for c in r] for r in rows]
    if not cells:
        return ""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        lines.append(indent + "  ".join(parts).rstrip())
    return "\n".join(lines)


def shape_str(shape) -> str:
    return "x".join(str(int(d)) for d in shape) if len(shape) else "scalar"


def size_str(n: int) -> str:
    """``1,990,112 bytes (1.9 MiB)``."""
    if n < 1024:
        return f"{n:,} bytes"
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n:,} bytes ({n / f:.1f} {unit})"
    raise AssertionError("unreachable")


def plural(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def num(v) -> str:
    """A statistic for humans: integers as integers, floats with 6 significant digits."""
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return str(int(v))
    return f"{v:.6g}"


def json_num(v):
    """A float for JSON: NaN and infinities have no JSON spelling, they become None."""
    if v is None:
        return None
    if isinstance(v, int):
        return v
    v = float(v)
    return v if math.isfinite(v) else None


def dumps(obj) -> str:
    """Indented JSON with lists of numbers (shapes, scales) kept on one line."""
    text = json.dumps(obj, indent=2)
    return _NUMBER_LIST.sub(
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",\n")) + "]", text)


def whole_number(minimum: int):
    """An argparse ``type``: a whole number of at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse
