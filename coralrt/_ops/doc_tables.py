"""The operator tables of the docs, generated from the operator specs.

Each table sits in a doc page between ``<!-- ops-table: NAME -->`` and
``<!-- ops-table end -->``; ``tests/test_docs.py`` fails when a page's table
differs from :func:`render` of the registry.  After changing a spec, rewrite
them with::

    python -m coralrt._ops.doc_tables
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from coralrt._ops import builtin_specs, family_of

__all__ = ["TABLES", "render", "tables_in", "update"]

_BLOCK = re.compile(
    r"(<!-- ops-table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- ops-table end -->)", re.S)


def _where(spec) -> str:
    if spec.tpu is not None:
        return "Edge TPU (published table)"
    if spec.compat is not None:
        return "Edge TPU in compat mode only"
    return "CPU only"


def _sim() -> str:
    rows = ["| operator | family file | maps to |", "|---|---|---|"]
    for name, spec in sorted(builtin_specs().items()):
        if spec.sim is not None:
            rows.append(f"| {name} | `coralrt/_ops/{family_of(name)}.py` | {_where(spec)} |")
    return "\n".join(rows) + "\n"


def _tpu() -> str:
    rows = ["| operator | highest version | fused activations | family file |",
            "|---|---|---|---|"]
    for name, spec in sorted(builtin_specs().items()):
        rule = spec.tpu or spec.compat
        if rule is None:
            continue
        mode = "" if spec.tpu is not None else " (compat mode)"
        acts = ", ".join(sorted(rule.activations))
        rows.append(f"| {name}{mode} | {rule.max_version} | {acts} | "
                    f"`coralrt/_ops/{family_of(name)}.py` |")
    return "\n".join(rows) + "\n"


#: Table name -> renderer.
TABLES = {"sim-kernels": _sim, "tpu-rules": _tpu}


def render(name: str) -> str:
    return TABLES[name]()


def tables_in(text: str) -> dict[str, str]:
    """Table name -> the table as written between its markers in ``text``."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(text)}


def update(path: Path) -> bool:
    """Rewrite the tables of one doc page; True when something changed."""
    text = path.read_text(encoding="utf-8")
    new = _BLOCK.sub(lambda m: m[1] + render(m["name"]) + m[4], text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs")
    for page in sorted(root.glob("*.md")):
        if update(page):
            print(f"updated {page}")
