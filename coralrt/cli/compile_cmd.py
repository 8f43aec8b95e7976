"""``coralrt compile MODEL``: compile ahead of time with the native compiler.

Writes ``<name>_coralrt.tflite`` (each Edge TPU segment one ``coralrt-segment``
operator) and ``<name>_coralrt.log`` in the layout of edgetpu_compiler's log.
"""

from __future__ import annotations

import logging
from pathlib import Path

from coralrt.cli._text import dumps
from coralrt.compile.edgetpu_compiler import EdgeTpuCompiler
from coralrt.compile.driver import compile_log, compile_model
from coralrt.compile.partition import MODES
from coralrt.fileio import atomic_write
from coralrt.model import load_model
from coralrt.model.compiled import refuse_compiled

__all__ = ["add_parser", "command"]

log = logging.getLogger("coralrt.cli")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "compile", parents=parents, help="compile a model's Edge TPU segments ahead of time",
        description="Partition a plain quantized model and compile every Edge TPU segment "
                    "with coralrt's native compiler. The output model runs with "
                    "target='sim'; the log lists every operator's status.")
    p.add_argument("model", metavar="MODEL", help="path of a plain (not yet compiled) .tflite")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="output .tflite path (default: MODEL's name with _coralrt, in the "
                        "current directory); the log is written next to it as .log")
    p.add_argument("--mode", choices=MODES, default="multi",
                   help="partition mode (default: multi)")
    p.add_argument("--compiler", choices=("native", "edgetpu_compiler"), default="native",
                   help="segment compiler: coralrt's native one (programs for target='sim', "
                        "the default) or edgetpu_compiler (programs for a real Coral stick; "
                        "the compiler runs on x86-64 Linux only)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (files written, summary, every operator's "
                        "placement) instead of the log's summary")
    p.set_defaults(func=command)


def command(args) -> int:
    src = Path(args.model)
    suffix = "_edgetpu" if args.compiler == "edgetpu_compiler" else "_coralrt"
    out = Path(args.output) if args.output else Path.cwd() / f"{src.stem}{suffix}.tflite"
    if out.exists() and not args.force:
        raise FileExistsError(f"{out} exists; pass --force to overwrite it")
    model = load_model(src)
    refuse_compiled(model, str(src))
    log.info("compiling %s (%d operators, mode %s)", src, len(model.main.operators), args.mode)
    compiler = None
    if args.compiler == "edgetpu_compiler":
        compiler = EdgeTpuCompiler()  # CompilerUnavailableError names how to get it
    result = compile_model(model, mode=args.mode, compiler=compiler)
    data = result.to_bytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, data)
    text = compile_log(result, input_name=str(src), input_size=len(model.source or b""),
                       output_name=str(out), output_size=len(data))
    log_path = out.with_suffix(".log")
    atomic_write(log_path, text)
    if args.json:
        print(dumps({"input": str(src), "output": str(out), "log": str(log_path),
                     "input_bytes": len(model.source or b""), "output_bytes": len(data),
                     "compiler": args.compiler, **result.plan.to_dict()}))
        return 0
    summary, _, _ = text.partition("\nOperator ")
    print(summary.rstrip())
    print(f"Operation log: {log_path}")
    return 0
