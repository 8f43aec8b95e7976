"""The examples in the docs run as written."""

from __future__ import annotations

import re

import pytest
from conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks(name: str) -> list:
    text = (DOCS / name).read_text()
    return [pytest.param(code, id=f"{name}-{i}") for i, code in enumerate(_BLOCK.findall(text))]


@pytest.mark.parametrize("code", python_blocks("plugins.md"))
def test_plugin_guide_examples_run(code, capsys):
    exec(compile(code, "docs/plugins.md", "exec"), {"__name__": "__doc_example__"})
    assert capsys.readouterr().out  # every example prints what it shows


def test_plugin_guide_covers_every_hook():
    from coralrt.plugins import hookspecs
    text = (DOCS / "plugins.md").read_text()
    for name in dir(hookspecs):
        if name.startswith("coralrt_"):
            assert f"## `{name}(" in text, f"docs/plugins.md has no section for {name}"
