"""``coralrt compile MODEL...``: compile ahead of time.

With the native compiler (the default), or edgetpu_compiler and one model:
coralrt partitions the model and compiles every Edge TPU segment; writes
``<name>_coralrt.tflite`` / ``<name>_edgetpu.tflite`` and a ``.log`` in the
layout of edgetpu_compiler's log.

``--compiler remote`` / ``--compiler-url URL``: the same with each segment
compiled by a compile service (``coralrt serve-compiler``; docs/compile-service.md).

With ``--compiler edgetpu_compiler`` and several models, or ``--num-segments``:
whole-model mode (:mod:`coralrt._compile.whole`): edgetpu_compiler gets the whole
models in one call and partitions them itself (as partition mode ``compat``);
several models are co-compiled (they share the stick's parameter cache), and
``--num-segments N`` runs ``edgetpu_compiler -n N`` and also writes the merged
model of the N segments.
"""

from __future__ import annotations

import logging
from pathlib import Path

from coralrt._cli._progress import Progress
from coralrt._cli._text import dumps
from coralrt._cli.partition_cmd import rewritten
from coralrt._compile.segments import compile_log, compile_model
from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler
from coralrt._compile.partition import MODES, mib
from coralrt._compile.remote import RemoteCompiler
from coralrt._compile.whole import compile_whole, output_stem
from coralrt.errors import ConfigError
from coralrt._fileio import atomic_write
from coralrt._formats.opnames import EDGETPU_OP
from coralrt._model import load_model
from coralrt._model.compiled import refuse_compiled

__all__ = ["add_parser", "command"]

log = logging.getLogger("coralrt.cli")

# What a native compile writes, said after its summary: the programs are coralrt's own.
SIM_ONLY = ("{out} is compiled by coralrt for the simulated Edge TPU: it runs with "
            "--target sim (target='sim') only. A Coral stick needs edgetpu_compiler's "
            "output: compile with --compiler edgetpu_compiler (x86-64 Linux) or on a compile "
            "service (--compiler-url), or use a compile cache shipped from such a machine "
            "(coralrt cache import).")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "compile", parents=parents, help="compile a model's Edge TPU segments ahead of time",
        description="Partition a plain quantized model and compile every Edge TPU segment "
                    "with coralrt's native compiler (the default: the output runs only on "
                    "the simulated Edge TPU, target='sim', not on a stick) or "
                    "edgetpu_compiler (target='coral'). With --compiler edgetpu_compiler, "
                    "several models are co-compiled in one edgetpu_compiler call (they share "
                    "the stick's parameter cache; earlier models get priority), and "
                    "--num-segments N cuts one model into N pipeline segments; in both cases "
                    "edgetpu_compiler partitions the whole models itself (coralrt's "
                    "partitioner is not used: the same as --mode compat).")
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="path of a plain (not yet compiled) .tflite; several with "
                        "--compiler edgetpu_compiler to co-compile them")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="output .tflite path (default: MODEL's name with _coralrt or "
                        "_edgetpu, in the current directory); the log is written next to it "
                        "as .log. With several models: the output folder (default: the "
                        "current directory)")
    p.add_argument("--mode", choices=MODES, default=None,
                   help="partition mode (default: multi); whole-model compiles "
                        "(several models, --num-segments) are always compat")
    p.add_argument("--compiler", choices=("native", "edgetpu_compiler", "remote"),
                   default=None,
                   help="segment compiler: coralrt's native one (programs for target='sim', "
                        "the default), edgetpu_compiler (programs for a real Coral stick; "
                        "the compiler runs on x86-64 Linux only) or remote (edgetpu_compiler "
                        "on a compile service: --compiler-url or CORALRT_COMPILER_URL)")
    p.add_argument("--compiler-url", metavar="URL",
                   help="compile each segment on this compile service (coralrt "
                        "serve-compiler); implies --compiler remote. The token comes from "
                        "CORALRT_COMPILER_TOKEN or CORALRT_COMPILER_TOKEN_FILE")
    p.add_argument("--num-segments", type=int, metavar="N", default=None,
                   help="edgetpu_compiler only, one model: run 'edgetpu_compiler -n N', keep "
                        "its N files <name>_segment_<i>_of_<N>_edgetpu.tflite (pycoral's "
                        "pipeline segments) and write <name>_edgetpu.tflite, the segments "
                        "joined into one model that a session pipelines over a list of "
                        "sticks; 1 compiles the whole model without -n")
    p.add_argument("--rewrites", metavar="SPEC", default=None,
                   help="graph rewrites before partitioning, as for `coralrt partition`: "
                        "exact (default in multi mode), auto, none (default in compat "
                        "mode) or comma-separated names (docs/rewrites.md)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (files written, summary, every operator's "
                        "placement) instead of the log's summary")
    p.set_defaults(func=command)


def command(args) -> int:
    if args.compiler_url and args.compiler not in (None, "remote"):
        raise ConfigError(f"--compiler-url compiles on a compile service: it does not go with "
                          f"--compiler {args.compiler}")
    args.compiler = args.compiler or ("remote" if args.compiler_url else "native")
    models = [Path(m) for m in args.models]
    args.model = args.models[0] if len(models) == 1 else None  # named in model errors
    whole = len(models) > 1 or args.num_segments is not None
    if args.num_segments is not None and args.num_segments < 1:
        raise ConfigError(f"--num-segments must be at least 1, not {args.num_segments}")
    if whole and args.compiler != "edgetpu_compiler":
        what = "co-compilation of several models" if len(models) > 1 else "--num-segments"
        why = ("a compile service compiles one model per request" if args.compiler == "remote"
               else "the native compiler compiles one model at a time")
        raise ConfigError(f"{what} is an edgetpu_compiler feature: use --compiler "
                          f"edgetpu_compiler on a machine that has it ({why})")
    if len(models) > 1 and args.num_segments is not None:
        raise ConfigError("--num-segments takes one model: edgetpu_compiler does not allow "
                          "-n/--num_segments when several models are co-compiled")
    if whole:
        if args.rewrites not in (None, "none"):
            raise ConfigError("--rewrites does not apply: edgetpu_compiler compiles whole "
                              "models as they are (co-compilation, --num-segments)")
        if args.mode not in (None, "compat"):
            raise ConfigError(f"--mode {args.mode} does not apply: edgetpu_compiler partitions "
                              f"whole models itself, as --mode compat")
        return _whole(args, models)
    return _one(args, models[0], args.mode or "multi")


def _one(args, src: Path, mode: str) -> int:
    suffix = "_coralrt" if args.compiler == "native" else "_edgetpu"
    out = Path(args.output) if args.output else Path.cwd() / f"{src.stem}{suffix}.tflite"
    if out.exists() and not args.force:
        raise FileExistsError(f"{out} exists; pass --force to overwrite it")
    source = model = load_model(src)
    refuse_compiled(model, str(src))
    model, records = rewritten(model, mode, args.rewrites)
    for record in records:
        log.info("%s", record.line())
    log.info("compiling %s (%d operators, mode %s)", src, len(model.main.operators), mode)
    compiler = None
    if args.compiler == "edgetpu_compiler":
        compiler = EdgeTpuCompiler()  # CompilerUnavailableError names how to get it
    elif args.compiler == "remote":
        compiler = RemoteCompiler(args.compiler_url)  # ConfigError without a URL
    with Progress.for_args(args).bar(desc="compiling Edge TPU segments", unit="op") as bar:
        result = compile_model(
            model, mode=mode, compiler=compiler,
            on_plan=lambda plan: bar.set_total(plan.summary["tpu_ops"]),
            on_segment=lambda index, operators, size, seconds: bar.update(operators))
        bar.finish()
    data = result.to_bytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, data)
    result.plan.rewrites = [r.to_dict() for r in records]
    text = compile_log(result, input_name=str(src), input_size=len(source.source or b""),
                       output_name=str(out), output_size=len(data))
    log_path = out.with_suffix(".log")
    atomic_write(log_path, text)
    if args.json:
        print(dumps({"input": str(src), "output": str(out), "log": str(log_path),
                     "input_bytes": len(source.source or b""), "output_bytes": len(data),
                     "compiler": args.compiler,
                     "runs_on": "sim" if args.compiler == "native" else "coral",
                     **result.plan.to_dict()}))
        return 0
    summary, _, _ = text.partition("\nOperator ")
    print(summary.rstrip())
    print(f"Operation log: {log_path}")
    if args.compiler == "native":
        print(SIM_ONLY.format(out=out))
    return 0


def _whole(args, models: list[Path]) -> int:
    n = args.num_segments or 1
    if len(models) > 1:
        folder = Path(args.output) if args.output else Path.cwd()
        if folder.suffix == ".tflite" or folder.is_file():
            raise ConfigError(f"with several models -o names an output folder, not a file "
                              f"({folder})")
        outs = [folder / f"{output_stem(m)}_edgetpu.tflite" for m in models]
    else:
        outs = [Path(args.output) if args.output
                else Path.cwd() / f"{output_stem(models[0])}_edgetpu.tflite"]
    seg_paths = [outs[0].parent / f"{output_stem(models[0])}_segment_{i}_of_{n}_edgetpu.tflite"
                 for i in range(n)] if n > 1 else []
    for path in (*outs, *seg_paths):
        if path.exists() and not args.force:
            raise FileExistsError(f"{path} exists; pass --force to overwrite it")
    plains = []
    for m in models:
        plain = load_model(m)
        refuse_compiled(plain, str(m))
        plains.append(plain)
    compiler = EdgeTpuCompiler()  # CompilerUnavailableError names how to get it
    log.info("compiling %d whole model(s) with edgetpu_compiler%s", len(models),
             f" into {n} segments" if n > 1 else "")
    run = compile_whole(compiler, models, num_segments=n, plains=plains)
    written = []
    for src, out, result, segments in zip(models, outs, run.outputs, run.segments):
        out.parent.mkdir(parents=True, exist_ok=True)
        seg_files = []
        for seg, path in zip(segments, seg_paths):
            atomic_write(path, seg.data)
            atomic_write(path.with_suffix(".log"), seg.log)
            seg_files.append({"output": str(path), "log": str(path.with_suffix(".log")),
                              "edgetpu_ops": _customs(seg.model),
                              "operators": len(seg.model.main.operators)})
        atomic_write(out, result.data)
        atomic_write(out.with_suffix(".log"), result.log)
        r = result.report
        written.append({"input": str(src), "output": str(out), "log": str(out.with_suffix(".log")),
                        "input_bytes": src.stat().st_size, "output_bytes": len(result.data),
                        "edgetpu_ops": _customs(result.model),
                        "operators": len(result.model.main.operators),
                        "total_ops": r.get("total_ops"), "tpu_ops": r.get("tpu_ops"),
                        "cpu_ops": r.get("cpu_ops"), "on_chip_bytes": r.get("on_chip_bytes"),
                        "off_chip_bytes": r.get("off_chip_bytes"), "segments": seg_files})
    if args.json:
        print(dumps({"compiler": run.compiler, "mode": "compat", "co_compiled": len(models) > 1,
                     "num_segments": n, "command": run.command, "outputs": written}))
        return 0
    what = (f"{len(models)} models co-compiled in one run" if len(models) > 1
            else f"whole model, {n} segments" if n > 1 else "whole model")
    print(f"coralrt compile with {run.compiler} ({what})")
    for w in written:
        print(f"\nInput model: {w['input']}")
        print(f"Output model: {w['output']}")
        if w["on_chip_bytes"] is not None:
            print(f"On-chip memory used for caching model parameters: {mib(w['on_chip_bytes'])}")
        if w["off_chip_bytes"] is not None:
            print(f"Off-chip memory used for streaming uncached model parameters: "
                  f"{mib(w['off_chip_bytes'])}")
        print(f"Number of Edge TPU subgraphs: {w['edgetpu_ops']}")
        for seg in w["segments"]:
            print(f"Segment: {seg['output']} ({seg['edgetpu_ops']} Edge TPU subgraph(s), "
                  f"{seg['operators']} operator(s))")
        print(f"Operation log: {w['log']}")
    return 0


def _customs(model) -> int:
    return sum(op.name == EDGETPU_OP for op in model.main.operators)
