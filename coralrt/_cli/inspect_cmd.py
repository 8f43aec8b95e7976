"""``coralrt inspect MODEL``: what a .tflite file contains, without running it.

:func:`model_report` builds the JSON-ready description; the text output is a
rendering of that same dict, so both forms always say the same thing.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from coralrt._cli._text import dumps, shape_str, size_str, table
from coralrt.errors import ExecutableError
from coralrt._formats.dwn1 import describe, parse_package
from coralrt._formats.opnames import EDGETPU_OP
from coralrt._model import Model, load_model
from coralrt._model.compiled import compiled_by
from coralrt._tensors import tensor_infos

__all__ = ["add_parser", "command", "model_report", "format_report"]


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "inspect", parents=parents, help="describe a .tflite model",
        description="Describe a .tflite model: inputs and outputs with their quantization, "
                    "operators, custom operators, size, and whether edgetpu_compiler "
                    "produced it. Nothing is run.")
    p.add_argument("model", metavar="MODEL", help="path of the .tflite file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=command)


def command(args) -> int:
    report = model_report(args.model)
    if args.json:
        print(dumps(report))
    else:
        print(format_report(report))
    return 0


def _parameter_bytes(model: Model) -> int:
    # Count each buffer once: several tensors (or subgraphs) may share one.
    seen: dict[int, int] = {}
    for sg in model.subgraphs:
        for t in sg.tensors:
            if t.is_constant:
                seen[id(t.buffer)] = t.buffer.nbytes
    return sum(seen.values())


def _edgetpu_report(model: Model) -> list[dict]:
    """One entry per ``edgetpu-custom-op``: its DWN1 package, or the reason it is unreadable."""
    out = []
    for si, g in enumerate(model.subgraphs):
        for oi, op in enumerate(g.operators):
            if op.name != EDGETPU_OP:
                continue
            entry: dict = {"subgraph": si, "operator": oi}
            try:
                entry.update(describe(parse_package(op.custom_options or b"")))
            except ExecutableError as e:
                entry.update(error=str(e), executables=[])
            out.append(entry)
    return out


def model_report(path) -> dict:
    """The description ``coralrt inspect --json`` prints, for a model file.

    Raises :class:`~coralrt.errors.ModelError` for files that are not valid
    TFLite models.
    """
    # load_model on the path (not on bytes) so that its errors name the file.
    model = load_model(Path(path))
    size = len(model.source) if model.source is not None else Path(path).stat().st_size
    sg = model.main
    ops = Counter(op.name or "CUSTOM" for g in model.subgraphs for op in g.operators)
    custom = [op for g in model.subgraphs for op in g.operators if op.opcode.is_custom]
    custom_names = list(dict.fromkeys(op.name or "CUSTOM" for op in custom))
    return {
        "path": str(path),
        "size_bytes": size,
        "description": model.description,
        "schema_version": model.version,
        "edgetpu_compiled": model.is_edgetpu_compiled,
        "compiled_by": compiled_by(model),
        "subgraphs": len(model.subgraphs),
        "tensors": sum(len(g.tensors) for g in model.subgraphs),
        "operator_count": sum(ops.values()),
        # Most frequent first; ties keep first-use order (Counter preserves it).
        "operators": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
        "custom_ops": custom_names,
        "custom_op_count": len(custom),
        "parameter_bytes": _parameter_bytes(model),
        "signatures": [s.key for s in model.signatures],
        "inputs": [t.to_dict() for t in tensor_infos(sg, sg.inputs)],
        "outputs": [t.to_dict() for t in tensor_infos(sg, sg.outputs)],
        "edgetpu": _edgetpu_report(model),
    }


def _quant_cells(d: dict) -> list[str]:
    q = d["quantization"]
    if "scales" in q:
        n, axis = len(q["scales"]), q["quantized_dimension"]
        return [f"per-channel ({n} scales, axis {axis})", ""]
    if q["scale"] == 0.0:
        return ["-", "-"]
    return [f"{q['scale']:.6g}", str(q["zero_point"])]


def _tensor_table(tensors: list[dict]) -> str:
    rows = []
    for d in tensors:
        shape = shape_str(d["shape"])
        if "shape_signature" in d:
            shape += " (" + shape_str(d["shape_signature"]).replace("-1", "?") + ")"
        rows.append([d["name"], shape, d["dtype"], *_quant_cells(d)])
    return table(["name", "shape", "dtype", "scale", "zero point"], rows, right={4})


def _edgetpu_lines(ops: list[dict]) -> list[str]:
    lines = [f"Edge TPU executables ({len(ops)} edgetpu-custom-op)"]
    for op in ops:
        where = f"  subgraph {op['subgraph']}, operator {op['operator']}"
        if "error" in op:
            lines.append(f"{where}: unreadable: {op['error']}")
            continue
        early = any(e.get("layer_format") == "early" for e in op["executables"])
        build = _compiler_build(op["compiler_version"])
        lines.append(f"{where}: {op['layout']} layout, min runtime version "
                     f"{op['min_runtime_version']}"
                     + (f", compiler build {build}" if build else "")
                     + (", early Layer tables (inputs read as 8-bit)" if early else ""))
        rows = [[_enum_cell(e["type"]), e["role"], size_str(e["parameters_bytes"]),
                 size_str(e["instruction_bytes"]), f"{e['caching_token']:#018x}",
                 f"{len(e['inputs'])} in, {len(e['outputs'])} out"]
                for e in op["executables"]]
        lines.append(table(["type", "role", "parameters", "instructions", "caching token",
                            "layers"], rows, indent="    "))
        lines += _layer_lines(op["executables"])
        # Values outside coralrt's schema: kept as numbers, the rest is still shown.
        lines += [f"    warning: {u['message']}" for u in op.get("unknown_values", [])]
    return lines + [""]


def _compiler_build(version: str) -> str:
    """The package's compiler version string when it says something: edgetpu_compiler
    writes "cl/" and its build's change number, or "cl/" alone (nothing to show)."""
    version = (version or "").strip()
    return "" if version.rstrip("/") in ("", "cl") else version


def _enum_cell(value) -> str:
    """An enum name, or "unknown (17)" for a number coralrt's schema does not name."""
    return value if isinstance(value, str) else f"unknown ({int(value)})"


def _layer_lines(executables: list[dict]) -> list[str]:
    """Every executable's inputs and outputs as the device sees them."""
    rows = [[i, io, x["name"], shape_str(x["shape"]), _enum_cell(x["data_type"]),
             x["dtype"] or "-", f"{x['scale']:.6g}", x["zero_point"], x["size_bytes"]]
            for i, e in enumerate(executables)
            for io, layers in (("in", e["inputs"]), ("out", e["outputs"])) for x in layers]
    if not rows:
        return []
    return ["    layers", table(["exe", "io", "name", "shape", "data type", "dtype", "scale",
                                  "zero point", "bytes"], rows, indent="      ",
                                 right={0, 6, 7, 8})]


def format_report(r: dict) -> str:
    """The human-readable form of :func:`model_report`."""
    if r["edgetpu_compiled"]:
        n = r["operators"].get(EDGETPU_OP, 0)
        tpu = f"yes ({n} edgetpu-custom-op)"
    elif r.get("compiled_by") == "coralrt":
        tpu = ("no: compiled by coralrt for the simulated Edge TPU (runs with target='sim' "
               "only; a stick needs edgetpu_compiler's output)")
    else:
        tpu = "no"
    custom = ", ".join(r["custom_ops"]) if r["custom_ops"] else "none"
    head = [
        ["file", r["path"]],
        ["size", size_str(r["size_bytes"])],
        ["edgetpu compiled", tpu],
        ["subgraphs", str(r["subgraphs"])],
        ["tensors", str(r["tensors"])],
        ["operators", str(r["operator_count"])],
        ["custom ops", f"{r['custom_op_count']} ({custom})" if r["custom_op_count"] else "none"],
        ["parameters", size_str(r["parameter_bytes"])],
    ]
    if r["signatures"]:
        head.append(["signatures", ", ".join(r["signatures"])])
    if r["description"]:
        head.append(["description", r["description"]])
    lines = [table(None, head, indent=""), ""]
    lines += [f"inputs ({len(r['inputs'])})", _tensor_table(r["inputs"]), ""]
    lines += [f"outputs ({len(r['outputs'])})", _tensor_table(r["outputs"]), ""]
    if r.get("edgetpu"):
        lines += _edgetpu_lines(r["edgetpu"])
    op_rows = [[name, count] for name, count in r["operators"].items()]
    lines += [f"operators ({r['operator_count']})", table(["operator", "count"], op_rows,
                                                           right={1})]
    return "\n".join(lines)
