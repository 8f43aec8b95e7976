"""No library function is too complex to read: cyclomatic complexity at most 30.

30 is the upper bound of radon's grade D ("more than moderate"); a function above it
is split by concept.  Measured with radon (a dev dependency) over every module of
the ``coralrt`` package, methods and nested functions included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

radon = pytest.importorskip("radon.complexity", reason="radon is a dev dependency")

PACKAGE = Path(__file__).resolve().parents[1] / "coralrt"
LIMIT = 30


def _walk(blocks):
    for block in blocks:
        yield block
        yield from _walk(list(getattr(block, "methods", [])) +
                         list(getattr(block, "closures", [])))


def _blocks(code: str):
    return _walk(radon.cc_visit(code))


def test_no_library_function_has_a_cyclomatic_complexity_above_30():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 100                     # the whole package was read
    over = [f"{path.relative_to(PACKAGE.parent)}:{b.lineno} {b.fullname} ({b.complexity})"
            for path in files for b in _blocks(path.read_text(encoding="utf-8"))
            if b.complexity > LIMIT]
    assert not over, "split these by concept:\n" + "\n".join(over)
