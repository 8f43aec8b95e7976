"""Regenerate ``coralrt/_model/_schema.py`` from the TFLite schema.

coralrt reads and writes TFLite flatbuffers with its own generic codec
(``coralrt/_model/flatbuf.py``) driven by a table of the schema's enums,
unions and table layouts.  This script derives that table from the Python
bindings that ``flatc`` generated for ``tensorflow/lite/schema/schema.fbs``
and that the ``ai-edge-litert`` wheel ships, so the table follows the schema
version of the installed wheel.  Only the layout facts (field names, slot
numbers, types, defaults) are kept.

Usage (development only; coralrt never imports ai_edge_litert's bindings):

    python tools/gen_schema.py > coralrt/_model/_schema.py
"""

from __future__ import annotations

import inspect
import re
import sys

from ai_edge_litert import schema_py_generated as S

_SCALAR_FLAGS = {
    "Bool": "bool", "Int8": "int8", "Uint8": "uint8", "Int16": "int16", "Uint16": "uint16",
    "Int32": "int32", "Uint32": "uint32", "Int64": "int64", "Uint64": "uint64",
    "Float32": "float32", "Float64": "float64",
}


def snake(name: str) -> str:
    name = re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", name)
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def enum_values(cls) -> dict[str, int]:
    return {k: v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


def is_table(name: str) -> bool:
    return hasattr(S, name + "Start") and hasattr(S, name + "End")


def field_kind(table: str, field: str, prepend: str) -> str:
    if prepend in _SCALAR_FLAGS:
        return _SCALAR_FLAGS[prepend]
    src = inspect.getsource(getattr(getattr(S, table), field))
    if "self._tab.Union(" in src:
        return "union"
    if "self._tab.Vector(o)" in src:
        if "self._tab.String(" in src:
            return "[string]"
        m = re.search(r"obj = (\w+)\(\)", src)
        if m:
            return f"[{m.group(1)}]"
        m = re.search(r"number_types\.(\w+)Flags, a \+", src)
        return f"[{_SCALAR_FLAGS[m.group(1)]}]"
    if "self._tab.String(" in src:
        return "string"
    m = re.search(r"obj = (\w+)\(\)", src)
    if m and "Indirect" in src:
        return m.group(1)
    raise SystemExit(f"cannot classify {table}.{field}")


def table_fields(table: str) -> list[tuple]:
    fields = []
    prefix = table + "Add"
    for fname, fn in vars(S).items():
        if not (fname.startswith(prefix) and callable(fn)):
            continue
        field = fname[len(prefix):]
        src = inspect.getsource(fn)
        m = re.search(r"builder\.Prepend(\w+?)Slot\((\d+), .*?, ([^)]*)\)\s*$", src, re.M)
        if not m:
            raise SystemExit(f"cannot parse {fname}: {src}")
        prepend, slot, default = m.group(1), int(m.group(2)), m.group(3).strip()
        if prepend == "UOffsetTRelative":
            kind = field_kind(table, field, prepend)
            default_val = None
        else:
            kind = field_kind(table, field, prepend)
            if kind == "bool":
                default_val = default in ("True", "1")
            else:
                default_val = float(default) if kind.startswith("float") else int(default)
        fields.append((snake(field), slot, kind, default_val))
    # The union's type field is named "<field>_type" and precedes the union slot.
    union_types = {f[0][: -len("_type")] for f in fields if f[0].endswith("_type")}
    out = []
    for name, slot, kind, default in sorted(fields, key=lambda f: f[1]):
        if kind == "union":
            kind = "union:" + union_enum(table, name)
        elif name.endswith("_type") and name[: -len("_type")] in union_types and kind == "uint8":
            kind = "utype"
        out.append((name, slot, kind, default))
    return out


def union_enum(table: str, field: str) -> str:
    return {
        ("Operator", "builtin_options"): "BuiltinOptions",
        ("Operator", "builtin_options2"): "BuiltinOptions2",
        ("QuantizationParameters", "details"): "QuantizationDetails",
        ("DimensionMetadata", "array_segments"): "SparseIndexVector",
        ("DimensionMetadata", "array_indices"): "SparseIndexVector",
    }[(table, field)]


def main() -> None:
    unions = ["BuiltinOptions", "BuiltinOptions2", "QuantizationDetails", "SparseIndexVector"]
    enums = ["TensorType", "BuiltinOperator", "Padding", "ActivationFunctionType",
             "CustomOptionsFormat", "FullyConnectedOptionsWeightsFormat", "LSHProjectionType",
             "LSTMKernelType", "CombinerType", "MirrorPadMode", "DimensionType"]
    todo = ["Model"] + [m for u in unions for m in enum_values(getattr(S, u)) if m != "NONE"]
    tables: dict[str, list] = {}
    while todo:
        name = todo.pop()
        if name in tables or not is_table(name):
            continue
        tables[name] = table_fields(name)
        for _, _, kind, _ in tables[name]:
            ref = kind.strip("[]")
            if is_table(ref):
                todo.append(ref)
    w = sys.stdout.write
    w('"""TFLite schema layout: enums, unions and table fields.\n\n'
      "Generated by tools/gen_schema.py from the TFLite schema (Apache-2.0); do not edit.\n"
      "A table field is (name, slot, kind, default). kind is a scalar type name,\n"
      "'string', a table name, '[elem]' for a vector, 'utype' for a union's type tag\n"
      "or 'union:<Union>' for the union value.\n"
      '"""\n\n')
    w(f"SCHEMA_SOURCE = 'ai-edge-litert {_version()}'\n\n")
    w("ENUMS = {\n")
    for e in enums:
        w(f"    {e!r}: {enum_values(getattr(S, e))!r},\n")
    w("}\n\nUNIONS = {\n")
    for u in unions:
        members = {v: k for k, v in enum_values(getattr(S, u)).items() if k != "NONE"}
        w(f"    {u!r}: {dict(sorted(members.items()))!r},\n")
    w("}\n\nTABLES = {\n")
    for name in sorted(tables):
        w(f"    {name!r}: (\n")
        for f in tables[name]:
            w(f"        {f!r},\n")
        w("    ),\n")
    w("}\n")


def _version() -> str:
    from importlib.metadata import version
    return version("ai-edge-litert")


if __name__ == "__main__":
    main()
