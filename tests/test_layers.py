"""The package's layers: imports only go down, and no module imports itself in a circle.

Every module under ``coralrt/`` is read with :mod:`ast` (never imported) and
each ``import`` / ``from ... import`` of a coralrt module is collected, at any
depth (inside functions too), relative ones resolved.  ``from X import name``
counts as an import of ``X.name`` when ``X/name.py`` or ``X/name/__init__.py``
exists, else of ``X``.  Only the module an import statement names counts: that
importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__`` is not
modelled.

* Layer check: a module imports from its own layer or lower ones only.
  Imports under ``if TYPE_CHECKING:`` count here (they are still a
  dependency of the source text).
* Cycle check: no cycle among the imports that execute, that is, all but
  those under ``if TYPE_CHECKING:``.
* Every module belongs to a layer, so a new package has to be placed in
  ``LAYERS`` before it can be imported from anywhere.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from conftest import REPO_ROOT

PACKAGE = "coralrt"

# The layer order, bottom (0) to top: written here only.  docs/architecture.md
# ("Layers") shows this table, rendered by ``python tests/test_layers.py``
# (test_the_architecture_doc_shows_the_layers fails until it does).
#
# A module belongs to the layer of the longest entry that equals its name or
# is a dotted prefix of it ("coralrt._sim" holds coralrt._sim.runner but not
# coralrt.simulator).  The root entry "coralrt" is the facade module
# (coralrt/__init__.py) only, never a prefix: otherwise it would hold every
# package missing from the table, and those must be placed here explicitly.
# Modules of one layer may import each other (the cycle check still applies).
LAYERS: list[tuple[str, ...]] = [
    ("coralrt.errors", "coralrt._formats.opnames"),
    ("coralrt._version", "coralrt._config", "coralrt._fileio", "coralrt._logs", "coralrt._wheels",
     "coralrt._kinds", "coralrt._ops.arith"),
    ("coralrt._model", "coralrt._ops"),
    ("coralrt._tensors",),
    ("coralrt._formats",),
    ("coralrt._compile",),
    ("coralrt._sim",),
    ("coralrt._runtime",),
    ("coralrt._backends",),
    ("coralrt._usb",),
    ("coralrt._sim.stick",),
    ("coralrt.plugins",),
    ("coralrt._targets",),
    ("coralrt._session",),
    ("coralrt.vision", "coralrt.gp"),
    ("coralrt._selftest",),
    ("coralrt",),
    ("coralrt._cli", "coralrt.__main__", "coralrt.tflite", "coralrt._server", "coralrt.testing"),
    ("coralrt.pycoral",),
    ("coralrt.compat",),
]
# What an entry holds, where its name does not say it (the docs' table shows it).
NOTES: dict[str, str] = {
    "coralrt.errors": "imports nothing of coralrt, like everything in this layer",
    "coralrt._formats.opnames": "the program formats' table",
    "coralrt._ops": "the operator specs: validation reads them at load time; they name the "
                   "kernels of the layers above by `\"module:name\"`",
    "coralrt._ops.arith": "the kernels' fixed-point and requantization arithmetic, "
                         "below the specs so that a family file can use it",
    "coralrt._formats": "segment format, memory plan, codec, DWN1 parsing",
    "coralrt._sim": "the simulated Edge TPU: kernels, runner, latency; not `coralrt._sim.stick`",
    "coralrt._sim.stick": "the simulated stick, a pyusb backend",
    "coralrt.vision": "task helpers: images in; classes, boxes, masks, keypoints out",
    "coralrt.gp": "array operations on Edge TPUs: numpy arrays in and out",
    "coralrt._selftest": "the checks of `coralrt selftest`: a stick end to end",
    "coralrt": "the facade, `coralrt/__init__.py`",
    "coralrt.tflite": "tflite_runtime's API",
    "coralrt._server": "the compile service",
    "coralrt.testing": "model builder, demo model, simulated sticks",
    "coralrt.pycoral": "pycoral's API over `coralrt.tflite`",
    "coralrt.compat": "maps `tflite_runtime` and `pycoral` imports",
}
# Layer 0 is stricter than "same or lower layer": it imports no coralrt module at all.
SELF_CONTAINED_LAYER = 0


# -- reading the source --------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    path: str            # file, relative to the scanned root's parent
    line: int
    importer: str        # module name
    imported: str        # module name, resolved
    type_only: bool      # under ``if TYPE_CHECKING:``


@dataclass
class Report:
    modules: dict[str, str]                  # module name -> file
    imports: list[Import]
    unmapped: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    cycles: list[list[str]] = field(default_factory=list)
    components: list[list[str]] = field(default_factory=list)   # one per cycle: its SCC


def find_modules(pkg_dir: Path) -> dict[str, Path]:
    """Module name -> file for every ``.py`` file under ``pkg_dir`` (a package)."""
    modules = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(pkg_dir.parent).with_suffix("")
        if "__pycache__" in rel.parts:
            continue
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                and isinstance(test.value, ast.Name) and test.value.id == "typing"))


def _walk(node: ast.AST, type_only: bool = False):
    """Every import statement in ``node``, with whether it sits under ``if TYPE_CHECKING:``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node, type_only
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
        for stmt in node.body:
            yield from _walk(stmt, True)
        for stmt in node.orelse:        # the ``else:`` branch is what runs
            yield from _walk(stmt, type_only)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _walk(child, type_only)


def _is_module(root: Path, name: str) -> bool:
    """Whether the module ``name`` exists as a file under ``root`` (the package's parent)."""
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def module_imports(name: str, path: Path, root: Path, package: str) -> list[Import]:
    """The imports of ``package`` modules made by module ``name`` (file ``path``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    rel = path.relative_to(root).as_posix()
    found = []

    def add(node: ast.AST, target: str, type_only: bool) -> None:
        if target == package or target.startswith(package + "."):
            imp = Import(rel, node.lineno, name, target, type_only)
            if imp not in found:    # ``from x import a, b`` of one module: one import
                found.append(imp)

    for node, type_only in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name, type_only)
            continue
        if node.level:      # relative: from the module's package, up level - 1 packages
            anchor = name.split(".") if is_package else name.split(".")[:-1]
            up = node.level - 1
            if up > len(anchor) - 1:
                raise ValueError(f"{rel}:{node.lineno}: relative import beyond {package}")
            anchor = anchor[:len(anchor) - up]
            base = ".".join(anchor + ([node.module] if node.module else []))
        else:
            base = node.module
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            add(node, sub if alias.name != "*" and _is_module(root, sub) else base, type_only)
    return found


# -- checking ------------------------------------------------------------------------------


def layer_of(module: str, layers, root_name: str = PACKAGE) -> tuple[int, str] | None:
    """(layer index, matching entry) of ``module``, or None when no entry holds it."""
    best = None
    for index, entries in enumerate(layers):
        for entry in entries:
            if module == entry or (entry != root_name and module.startswith(entry + ".")):
                if best is None or len(entry) > len(best[1]):
                    best = (index, entry)
    return best


def _describe(layer: tuple[int, str]) -> str:
    return f"layer {layer[0]} ({layer[1]})"


def find_cycles(edges: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """``(cycle, component)`` per strongly connected component of ``edges``
    with more than one module: a shortest cycle through its first module, as
    ``[a, b, ..., a]``, and all its modules.  Self-imports are ignored."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    for start in sorted(edges):     # iterative Tarjan: no recursion limit on deep chains
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ == node:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    cycles = []
    for component in components:
        members = set(component)
        first = component[0]
        # Shortest path from first back to itself inside the component (BFS).
        previous: dict[str, str] = {}
        queue = [first]
        found = None
        while queue and found is None:
            nxt = []
            for node in queue:
                for succ in sorted(edges.get(node, ())):
                    if succ not in members or succ == node:
                        continue
                    if succ == first:
                        found = node
                        break
                    if succ not in previous:
                        previous[succ] = node
                        nxt.append(succ)
                if found is not None:
                    break
            queue = nxt
        path = [first]
        node = found
        while node != first:
            path.append(node)
            node = previous[node]
        path.append(first)
        path.reverse()
        cycles.append((path, component))
    return cycles


def check_tree(pkg_dir: Path, layers, self_contained: int | None = SELF_CONTAINED_LAYER) -> Report:
    """Read every module of the package at ``pkg_dir`` and check it against ``layers``."""
    root = pkg_dir.parent
    package = pkg_dir.name
    files = find_modules(pkg_dir)
    report = Report({m: p.relative_to(root).as_posix() for m, p in files.items()}, [])
    for name, path in files.items():
        report.imports.extend(module_imports(name, path, root, package))

    unmapped = {m: f for m, f in report.modules.items() if layer_of(m, layers, package) is None}
    for imp in report.imports:
        if layer_of(imp.imported, layers, package) is None and imp.imported not in unmapped:
            unmapped[imp.imported] = f"imported at {imp.path}:{imp.line}"
    report.unmapped = [f"{m} ({where})" for m, where in sorted(unmapped.items())]

    for imp in report.imports:
        src = layer_of(imp.importer, layers, package)
        dst = layer_of(imp.imported, layers, package)
        if src is None or dst is None or imp.imported == imp.importer:
            continue
        where = f"{imp.path}:{imp.line}: {imp.importer} [{_describe(src)}]"
        if dst[0] > src[0]:
            report.violations.append(f"{where} imports {imp.imported} [{_describe(dst)}], "
                                     f"a higher layer")
        elif self_contained is not None and src[0] == self_contained:
            report.violations.append(f"{where} imports {imp.imported} [{_describe(dst)}]; "
                                     f"layer {self_contained} imports nothing of {package}")

    edges: dict[str, set[str]] = {m: set() for m in report.modules}
    for imp in report.imports:
        if not imp.type_only:
            edges.setdefault(imp.importer, set()).add(imp.imported)
    found = find_cycles(edges)
    report.cycles = [cycle for cycle, _ in found]
    report.components = [component for _, component in found]
    return report


def _cycle_text(report: Report, cycle: list[str], component: list[str]) -> str:
    """``a -> b -> a`` with the file and line of each import."""
    lines = [" -> ".join(cycle)]
    if len(component) > len(cycle) - 1:
        lines[0] += f"  (one of the cycles among {', '.join(component)})"
    for a, b in zip(cycle, cycle[1:]):
        at = [f"{i.path}:{i.line}" for i in report.imports
              if i.importer == a and i.imported == b and not i.type_only]
        lines.append(f"    {a} -> {b} at {', '.join(at)}")
    return "\n".join(lines)


# -- the package ---------------------------------------------------------------------------

_report: Report | None = None


def coralrt_report() -> Report:
    global _report
    if _report is None:
        _report = check_tree(REPO_ROOT / PACKAGE, LAYERS)
    return _report


def test_modules_found():
    report = coralrt_report()
    # Guards against a scan that silently finds nothing (and so checks nothing).
    assert {"coralrt", "coralrt.errors", "coralrt._session", "coralrt._sim.stick.device",
            "coralrt._cli.main"} <= set(report.modules)
    assert any(i.importer == "coralrt._session" for i in report.imports)


def test_every_module_has_a_layer():
    unmapped = coralrt_report().unmapped
    assert not unmapped, ("modules in no layer; place them in LAYERS in tests/test_layers.py "
                          "and in docs/architecture.md:\n  " + "\n  ".join(unmapped))


def test_imports_go_down_the_layers():
    violations = coralrt_report().violations
    assert not violations, (f"{len(violations)} import(s) against the layer order "
                            f"(docs/architecture.md):\n  " + "\n  ".join(violations))


def test_no_import_cycles():
    report = coralrt_report()
    assert not report.cycles, (f"{len(report.cycles)} import cycle(s) (imports under "
                               f"`if TYPE_CHECKING:` excluded):\n  "
                               + "\n  ".join(_cycle_text(report, c, m)
                                             for c, m in zip(report.cycles, report.components)))


# -- the docs' table ------------------------------------------------------------------------

ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
TABLE_START, TABLE_END = "<!-- layers: start -->", "<!-- layers: end -->"


def layer_table() -> str:
    """The Markdown table of LAYERS and NOTES, as docs/architecture.md shows it."""
    rows = ["| layer | modules |", "|---|---|"]
    for index, entries in enumerate(LAYERS):
        cells = [f"`{e}` ({NOTES[e]})" if e in NOTES else f"`{e}`" for e in entries]
        rows.append(f"| {index} | {', '.join(cells)} |")
    return "\n".join(rows)


def _doc_parts() -> tuple[str, str, str]:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    head, rest = text.split(TABLE_START + "\n", 1)
    table, tail = rest.split(TABLE_END, 1)
    return head, table.strip(), tail


def test_the_architecture_doc_shows_the_layers():
    assert _doc_parts()[1] == layer_table(), (
        "docs/architecture.md's layer table differs from LAYERS: run "
        "`python tests/test_layers.py` to write it")
    assert set(NOTES) <= {e for entries in LAYERS for e in entries}, "a note for no entry"


# -- the checker itself ---------------------------------------------------------------------

_TINY_LAYERS = [("pkg.errors",), ("pkg.low",), ("pkg.high",), ("pkg",)]


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_checker_reports_upward_imports_and_cycles(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.high import api\n",
        "pkg/errors.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from .b import x\n",                   # relative, same layer
        "pkg/low/b.py": ("def f():\n"
                         "    from pkg.low import a\n"          # a function-level import
                         "    from ..high import api\n"),       # upward, relative
        "pkg/high/__init__.py": "",
        "pkg/high/api.py": "import pkg.low\nfrom pkg import errors\n",
    })
    report = check_tree(pkg, _TINY_LAYERS)
    assert report.violations == [
        "pkg/low/b.py:3: pkg.low.b [layer 1 (pkg.low)] imports pkg.high.api "
        "[layer 2 (pkg.high)], a higher layer"]
    assert report.cycles == [["pkg.low.a", "pkg.low.b", "pkg.low.a"]]
    assert report.unmapped == []


def test_checker_resolution_and_type_checking(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/errors.py": ("from typing import TYPE_CHECKING\n"
                          "if TYPE_CHECKING:\n"
                          "    from pkg.low import a\n"),
        "pkg/low/__init__.py": "from . import a\nfrom .a import thing\n",
        "pkg/low/a.py": ("import typing\n"
                         "if typing.TYPE_CHECKING:\n"
                         "    from pkg.low import Thing\n"
                         "else:\n"
                         "    from pkg import errors\n"),
        "pkg/new/__init__.py": "",
    })
    report = check_tree(pkg, _TINY_LAYERS)
    got = {(i.importer, i.imported, i.type_only) for i in report.imports}
    assert got == {("pkg.errors", "pkg.low.a", True),
                   ("pkg.low", "pkg.low.a", False),
                   ("pkg.low.a", "pkg.low", True),       # a name, not a module: the package
                   ("pkg.low.a", "pkg.errors", False)}
    # The type-only import still breaks the layers (and layer 0 imports nothing) ...
    assert report.violations == [
        "pkg/errors.py:3: pkg.errors [layer 0 (pkg.errors)] imports pkg.low.a "
        "[layer 1 (pkg.low)], a higher layer"]
    # ... but a cycle through it never runs.
    assert report.cycles == []
    # "pkg" is the facade only, not a prefix that holds every new package.
    assert report.unmapped == ["pkg.new (pkg/new/__init__.py)"]


def test_layer_zero_imports_nothing(tmp_path):
    pkg = _write(tmp_path, {"pkg/__init__.py": "", "pkg/errors.py": "import pkg.errors\n",
                            "pkg/low.py": "", "pkg/zero2.py": "from pkg import low\n"})
    report = check_tree(pkg, [("pkg.errors", "pkg.zero2"), ("pkg.low",), ("pkg",)])
    assert report.violations == [
        "pkg/zero2.py:1: pkg.zero2 [layer 0 (pkg.zero2)] imports pkg.low "
        "[layer 1 (pkg.low)], a higher layer"]
    report = check_tree(pkg, [("pkg.errors", "pkg.zero2", "pkg.low"), ("pkg",)])
    assert report.violations == [
        "pkg/zero2.py:1: pkg.zero2 [layer 0 (pkg.zero2)] imports pkg.low "
        "[layer 0 (pkg.low)]; layer 0 imports nothing of pkg"]


if __name__ == "__main__":       # rewrite docs/architecture.md's layer table from LAYERS
    head, _, tail = _doc_parts()
    ARCHITECTURE.write_text(f"{head}{TABLE_START}\n{layer_table()}\n{TABLE_END}{tail}",
                            encoding="utf-8")
