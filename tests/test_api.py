"""The public API is exactly what ``docs/api.md`` lists.

* Every module whose dotted name has no part starting with ``_`` (``__main__``
  aside) is public and must have a section in ``docs/api.md``; everything else
  is internal (pluggy's layout: private modules behind package facades).
* A public module's ``__all__`` equals the names its section lists: a new
  public name fails here until the list has it, and so does a listed name
  that went away.
* The code in the docs, the README and the examples imports public modules
  and listed names only, so what users copy keeps working; a developer's
  example marked ``<!-- internal API -->`` (and saying so in its text) is
  exempt.
"""

from __future__ import annotations

import ast
import importlib
import re

import pytest
from conftest import REPO_ROOT

from tests.support.doc_blocks import DOC_FILES, read_blocks

API_DOC = REPO_ROOT / "docs" / "api.md"
PACKAGE = REPO_ROOT / "coralrt"
SECTION = re.compile(r"^## `(?P<module>coralrt[\w.]*)`\s*$", re.M)
ROW = re.compile(r"^\| `(?P<name>\w+)` \|", re.M)


def listed() -> dict[str, set[str]]:
    """Module -> the names its section of docs/api.md lists (table rows)."""
    text = API_DOC.read_text(encoding="utf-8")
    marks = list(SECTION.finditer(text))
    sections = {}
    for m, end in zip(marks, [*(x.start() for x in marks[1:]), len(text)]):
        sections[m["module"]] = {r["name"] for r in ROW.finditer(text, m.end(), end)}
    return sections


def public_modules() -> list[str]:
    """Every module under coralrt/ without a private part in its name."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
            continue
        names.append(".".join(parts))
    return names


LISTED = listed()


def test_the_api_doc_has_sections():
    assert "coralrt" in LISTED and len(LISTED) >= 5, sorted(LISTED)


def test_every_public_module_is_listed():
    missing = [m for m in public_modules() if m not in LISTED]
    assert not missing, ("public modules (no '_' in their name) that docs/api.md does not "
                         "list; list them or make them private:\n  " + "\n  ".join(missing))
    gone = [m for m in LISTED if m not in public_modules()]
    assert not gone, f"docs/api.md lists modules that do not exist: {gone}"


REFUSES = re.compile(r"^Importing it raises `ImportError`", re.M)


def _refused() -> set[str]:
    """Modules whose section says that importing them raises ImportError."""
    text = API_DOC.read_text(encoding="utf-8")
    marks = list(SECTION.finditer(text))
    return {m["module"] for m, end in zip(marks, [*(x.start() for x in marks[1:]), len(text)])
            if REFUSES.search(text, m.end(), end)}


@pytest.mark.parametrize("module", sorted(LISTED))
def test_a_public_module_exports_exactly_the_listed_names(module):
    if module in _refused():
        with pytest.raises(ImportError):
            importlib.import_module(module)
        return
    mod = importlib.import_module(module)
    exported = set(getattr(mod, "__all__", ()))
    new, gone = sorted(exported - LISTED[module]), sorted(LISTED[module] - exported)
    assert not new, f"{module}: public names that docs/api.md does not list: {new}"
    assert not gone, f"{module}: names docs/api.md lists that it does not export: {gone}"
    for name in exported:
        assert hasattr(mod, name), f"{module}.__all__ names {name!r}, which is not there"


def _imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names) of each coralrt import in ``source`` (names: [] for ``import x``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] == "coralrt"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "coralrt":
            found.append((node.module, [a.name for a in node.names]))
    return found


INTERNAL = "<!-- internal API -->"


def _marked_internal(block) -> bool:
    """Whether the line above the block's fence (blank lines and a ``not run``
    marker skipped) is ``<!-- internal API -->``: a developer's example that
    uses internal modules on purpose and says so in the text."""
    lines = block.path.read_text(encoding="utf-8").splitlines()[:block.line - 1]
    above = [line.strip() for line in lines if line.strip()]
    above = [line for line in above[-2:] if "not run:" not in line]
    return bool(above) and above[-1] == INTERNAL


def _user_code() -> list[tuple[str, str]]:
    code = [(b.where, b.code) for path in DOC_FILES for b in read_blocks(path)
            if b.lang == "python" and not _marked_internal(b)]
    code += [(str(p.relative_to(REPO_ROOT)), p.read_text(encoding="utf-8"))
             for p in sorted((REPO_ROOT / "examples").rglob("*.py"))]
    return code


def test_docs_and_examples_use_the_public_api_only():
    bad = []
    for where, source in _user_code():
        for module, names in _imports(source):
            if module not in LISTED:
                bad.append(f"{where}: imports {module}")
                continue
            for name in names:
                if name != "*" and name not in LISTED[module] \
                        and f"{module}.{name}" not in LISTED:
                    bad.append(f"{where}: imports {name} from {module}")
    assert not bad, "user-facing code that reaches past the public API:\n  " + "\n  ".join(bad)


def test_the_import_reader_sees_every_form():
    src = "import coralrt.vision\nfrom coralrt import x, y\nfrom . import z\nimport numpy"
    assert _imports(src) == [("coralrt.vision", []), ("coralrt", ["x", "y"])]
    assert public_modules() and all(not any(p.startswith("_") for p in m.split("."))
                                    for m in public_modules())
