"""The ``edgetpu_compiler`` plugin: Google's Edge TPU compiler as a segment compiler.

Programs made by edgetpu_compiler run on a real Coral USB Accelerator, so
this is the compiler ``target="coral"`` uses to compile a plain quantized
model just in time.  coralrt partitions the model itself
(:mod:`coralrt._compile.partition`) and hands each Edge TPU segment to the
compiler as a standalone sub-model; ``compile_segment`` runs the binary on
it with a timeout, parses its log (the summary lines and the per-operator
``Operator  Count  Status`` table) and returns the DWN1 package that the
``edgetpu-custom-op`` of ``<name>_edgetpu.tflite`` carries.  When the
compiler leaves operators of the segment on the CPU it raises
:class:`~coralrt.errors.SegmentNotMapped` with the log's reasons, and
:func:`coralrt._compile.segments.compile_model` moves them to the CPU and
compiles the rest of the segment again.

edgetpu_compiler is closed source and built for x86-64 Linux only.  The
binary is found through ``CORALRT_EDGETPU_COMPILER`` and then ``PATH``
(:func:`find_compiler`).  On another machine (a 64-bit Raspberry Pi) an
x86-64 binary runs under an emulator, box64 or qemu-x86_64, or through the
kernel's binfmt_misc: :mod:`coralrt._compile.emulation` decides, and every run
(``--version`` and compiles) puts its :attr:`EdgeTpuCompiler.command_prefix`
before the binary.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from functools import cached_property
from pathlib import Path

from coralrt import _config as config
from coralrt._compile import emulation
from coralrt._compile.base import Compiler
from coralrt._compile.rules import MAPPED
from coralrt._formats.opnames import EDGETPU_OP
from coralrt.errors import CompileError, CompilerUnavailableError, SegmentNotMapped
from coralrt._model import Model, load_model

__all__ = ["COMPILER_ID", "EdgeTpuCompiler", "CompiledSegment", "find_compiler", "package_of",
           "parse_version", "parse_log"]

log = logging.getLogger("coralrt.compile")

COMPILER_ID = "edgetpu_compiler"
BINARY = "edgetpu_compiler"
LEFT_ON_CPU = "Left on the CPU by edgetpu_compiler (its log gives no status for this operator)"
TAIL_LINES = 30
_VERSIONS: dict[tuple, str] = {}  # (resolved path, mtime, size) -> version

_VERSION = re.compile(r"Edge TPU Compiler version\s+(\S+)")
_SIZE = re.compile(r"([\d.]+)\s*([KMGT]?)i?B", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_TABLE_HEAD = re.compile(r"^\s*Operator\s+Count\s+Status\s*$")
_ROW = re.compile(r"^\s*(\S+)\s+(\d+)\s+(\S.*?)\s*$")
_FIELDS = {  # key -> (pattern, converter)
    "compile_ms": (r"Model compiled successfully in (\d+) ms", int),
    "input_model": (r"^Input(?: model)?:\s*(.+?)\s*$", str),
    "output_model": (r"^Output(?: model)?:\s*(.+?)\s*$", str),
    "input_size": (r"^Input size:\s*(.+?)\s*$", "size"),
    "output_size": (r"^Output size:\s*(.+?)\s*$", "size"),
    "on_chip_bytes": (r"On-chip memory used for caching model parameters:\s*(.+?)\s*$", "size"),
    "on_chip_remaining_bytes": (r"On-chip memory remaining for caching model parameters:"
                                r"\s*(.+?)\s*$", "size"),
    "off_chip_bytes": (r"Off-chip memory used for streaming uncached model parameters:"
                       r"\s*(.+?)\s*$", "size"),
    "subgraphs": (r"Number of Edge TPU subgraphs:\s*(\d+)", int),
    "total_ops": (r"Total number of operations:\s*(\d+)", int),
    "tpu_ops": (r"Number of operations that will run on Edge TPU:\s*(\d+)", int),
    "cpu_ops": (r"Number of operations that will run on CPU:\s*(\d+)", int),
    "log_file": (r"^Operation log:\s*(.+?)\s*$", str),
}


def find_compiler() -> Path | None:
    """The edgetpu_compiler to use: ``CORALRT_EDGETPU_COMPILER``, then ``PATH``; None if neither."""
    path = config.edgetpu_compiler()
    if path is not None:
        return path
    found = shutil.which(BINARY)
    return Path(found) if found else None


def parse_version(text: str) -> str | None:
    """``"16.0.384591198"`` from ``"Edge TPU Compiler version 16.0.384591198"``."""
    m = _VERSION.search(text)
    return m.group(1) if m else None


def _size(text: str) -> int | None:
    m = _SIZE.search(text)
    if m is None:
        return None
    return round(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_log(text: str) -> dict:
    """edgetpu_compiler's output or ``.log`` file as a dict.

    Keys: ``version``, ``succeeded``, ``compile_ms``, ``input_model``,
    ``output_model``, ``input_size``, ``output_size``, ``on_chip_bytes``,
    ``on_chip_remaining_bytes``, ``off_chip_bytes`` (bytes, from the MiB/KiB/B
    figures), ``subgraphs``, ``total_ops``, ``tpu_ops``, ``cpu_ops``,
    ``operators`` (the table's rows: ``{"operator", "count", "status"}``),
    ``all_mapped`` and ``errors`` (lines that report an error).  A value the
    text does not give is None (``subgraphs`` before compiler 16).  When the
    two "Number of operations" lines are missing, the counts come from the
    table, or all operations count as mapped (the compiler omits them then).
    """
    info: dict = {"version": parse_version(text)}
    for key, (pattern, conv) in _FIELDS.items():
        m = re.search(pattern, text, re.MULTILINE)
        value = m.group(1) if m else None
        if value is not None:
            value = _size(value) if conv == "size" else conv(value)
        info[key] = value
    info["succeeded"] = ("Compilation succeeded" in text
                         or "Model compiled successfully" in text)
    info["operators"] = _table(text)
    info["errors"] = [ln.strip() for ln in text.splitlines()
                      if re.search(r"\berror\b", ln, re.IGNORECASE)
                      and "Edge TPU Compiler version" not in ln]
    rows = info["operators"]
    if info["total_ops"] is None and rows:
        info["total_ops"] = sum(r["count"] for r in rows)
    if info["tpu_ops"] is None:
        if rows:
            info["tpu_ops"] = sum(r["count"] for r in rows if r["status"] == MAPPED)
        elif info["total_ops"] is not None:
            info["tpu_ops"] = info["total_ops"]
    if info["cpu_ops"] is None and info["tpu_ops"] is not None and info["total_ops"] is not None:
        info["cpu_ops"] = info["total_ops"] - info["tpu_ops"]
    info["all_mapped"] = info["cpu_ops"] == 0 if info["cpu_ops"] is not None else None
    return info


def _table(text: str) -> list[dict]:
    rows: list[dict] = []
    lines = iter(text.splitlines())
    for line in lines:
        if _TABLE_HEAD.match(line):
            break
    else:
        return rows
    for line in lines:
        if not line.strip() or set(line.strip()) <= set("-="):
            if rows:
                break
            continue
        m = _ROW.match(line)
        if m is None:
            break
        rows.append({"operator": m.group(1), "count": int(m.group(2)), "status": m.group(3)})
    return rows


def _tail(text: str, n: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


class CompiledSegment(bytes):
    """A DWN1 package (the ``custom_options`` of an ``edgetpu-custom-op``).

    Compares equal to the plain bytes; also carries the custom operator's
    tensor order (``input_names``, ``output_names``: the package's layers are
    bound to the operator's tensors by position) and the parsed log
    (``report``).
    """

    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    report: dict

    def __new__(cls, data, input_names=(), output_names=(), report=None):
        obj = super().__new__(cls, data)
        obj.input_names = tuple(input_names)
        obj.output_names = tuple(output_names)
        obj.report = dict(report or {})
        return obj

    def __reduce__(self):
        return (CompiledSegment, (bytes(self), self.input_names, self.output_names,
                                  self.report))


class EdgeTpuCompiler(Compiler):
    """Compiles Edge TPU segments with edgetpu_compiler; the programs run on a real stick.

    ``path``: the executable (default: :func:`find_compiler`); ``timeout``:
    seconds one run may take (default ``CORALRT_EDGETPU_COMPILER_TIMEOUT`` or
    180 s); ``extra_args``: more command-line options (``["-m", "13"]``).
    """

    id = COMPILER_ID
    runs_on = ("coral",)
    op_name = EDGETPU_OP

    def __init__(self, path: str | os.PathLike | None = None, *, timeout: float | None = None,
                 extra_args=()):
        self._path = Path(path) if path is not None else None
        self.timeout = float(timeout) if timeout is not None else \
            config.edgetpu_compiler_timeout()
        self.extra_args = [str(a) for a in extra_args]

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = find_compiler()
            if self._path is None:
                raise CompilerUnavailableError("edgetpu_compiler was not found on PATH and "
                                               "CORALRT_EDGETPU_COMPILER is not set.")
        return self._path

    @cached_property
    def version(self) -> str:
        """The compiler's version (``edgetpu_compiler --version``), asked once per binary."""
        path = self.path
        try:
            st = path.stat()
            key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        if key in _VERSIONS:
            return _VERSIONS[key]
        out, code = self._run([str(path), "--version"], min(self.timeout, 60.0), None)
        version = parse_version(out)
        if code != 0 or version is None:
            hint = emulation.run_hint(path)
            raise CompileError(f"{path} --version did not print an Edge TPU Compiler "
                               f"version (exit status {code})" + (f"; {hint}" if hint else ""),
                               log_tail=_tail(out), returncode=code)
        if key is not None:
            _VERSIONS[key] = version
        return version

    def __repr__(self) -> str:
        return f"EdgeTpuCompiler({str(self._path) if self._path else 'not located'!r})"

    @property
    def command_prefix(self) -> list[str]:
        """What runs the binary: ``[]`` (natively, or through binfmt_misc), or the
        x86-64 emulator (``["box64"]``, ``["qemu-x86_64", "-L", sysroot]``).  Raises
        CompilerUnavailableError when an x86-64 binary cannot run on this machine
        (:func:`coralrt._compile.emulation.command_prefix`)."""
        return emulation.command_prefix(self.path)

    def _run(self, cmd: list[str], timeout: float, cwd) -> tuple[str, int]:
        # cmd starts with the binary; the emulator, if one is needed, goes before it.
        cmd = [*self.command_prefix, *cmd]
        log.debug("running %s", shlex.join(cmd))
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
        except OSError as e:
            hint = ""
            if e.errno == errno.ENOEXEC:
                hint = emulation.run_hint(self.path) or "the binary does not run on this machine"
                hint = f" ({hint})"
            raise CompileError(f"cannot run {cmd[0]}: {e.strerror or e}{hint}") from e
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The compiler forks a child for the real work: stop its whole group.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
            text = out.decode("utf-8", "replace")
            raise CompileError(f"edgetpu_compiler did not finish within {timeout:g} s and was "
                               f"stopped; raise the limit with CORALRT_EDGETPU_COMPILER_TIMEOUT",
                               log_tail=_tail(text), timeout=timeout) from None
        return out.decode("utf-8", "replace"), proc.returncode

    def _timeout_args(self) -> list[str]:
        # Compiler 16 documents --timeout_sec (its own timer, default 180 s):
        # match it to ours so a longer limit is not cut short by the compiler.
        major = self.version.split(".", 1)[0]
        return ["-t", str(max(1, round(self.timeout)))] if major.isdigit() and \
            int(major) >= 16 else []

    def compile_segment(self, piece: Model) -> CompiledSegment:
        """The DWN1 package for ``piece`` (a standalone sub-model), every operator mapped.

        Raises :class:`SegmentNotMapped` when the compiler left operators on
        the CPU, :class:`CompileError` when it fails or runs past the timeout.
        """
        compiled, text = self.compile_raw(piece.to_bytes(),
                                          what=f"a segment of {len(piece.main.operators)} "
                                               f"operators")
        return package_of(piece, load_model(compiled), parse_log(text))

    def compile_raw(self, data: bytes, *, what: str = "a model") -> tuple[bytes, str]:
        """``(the compiled .tflite, the compiler's output and log file)`` for the model
        ``data``, as edgetpu_compiler writes them; CompileError when it fails, runs
        past the timeout or writes no output.  (The compile service serves this.)"""
        with tempfile.TemporaryDirectory(prefix="coralrt-edgetpu-") as tmp:
            src = Path(tmp) / "segment.tflite"
            src.write_bytes(data)
            out_dir = Path(tmp) / "out"
            out_dir.mkdir()
            cmd = [str(self.path), "-s", "-o", str(out_dir), *self._timeout_args(),
                   *self.extra_args, str(src)]
            text, code = self._run(cmd, self.timeout, tmp)
            log_file = out_dir / f"{src.stem}_edgetpu.log"
            if log_file.is_file():
                text += "\n" + log_file.read_text("utf-8", "replace")
            if code != 0:
                raise CompileError(f"edgetpu_compiler failed on {what} (exit status {code})",
                                   log_tail=_tail(text), returncode=code)
            compiled_path = out_dir / f"{src.stem}_edgetpu.tflite"
            if not compiled_path.is_file():
                raise CompileError(f"edgetpu_compiler exited normally but wrote no "
                                   f"{compiled_path.name}", log_tail=_tail(text), returncode=code)
            return compiled_path.read_bytes(), text


def package_of(piece: Model, compiled: Model, report: dict) -> CompiledSegment:
    """The package of ``compiled`` if it maps all of ``piece``; else SegmentNotMapped."""
    sg, csg = piece.main, compiled.main
    n = len(sg.operators)
    producer = {sg.tensors[t].name: k for k, op in enumerate(sg.operators) for t in op.outputs}
    customs = [op for op in csg.operators if op.name == EDGETPU_OP]
    cpu: set[int] = set()
    unknown = False
    for op in csg.operators:
        if op.name == EDGETPU_OP:
            continue
        found = {producer[csg.tensors[t].name] for t in op.outputs
                 if csg.tensors[t].name in producer}
        unknown |= not found
        cpu |= found
    if not customs or unknown:
        # Nothing mapped, or CPU operators that cannot be told apart: all on the CPU.
        cpu = set(range(n))
    if cpu:
        raise SegmentNotMapped(sorted(cpu), _reasons(sg, sorted(cpu), report), total_ops=n)
    if len(customs) > 1:
        # Mapped, but as several programs: the caller splits the segment.
        raise SegmentNotMapped([], {}, total_ops=n)
    op = customs[0]
    names = {t.name for t in sg.tensors}
    ins = [csg.tensors[t].name for t in op.inputs if t >= 0]
    outs = [csg.tensors[t].name for t in op.outputs]
    missing = [x for x in (*ins, *outs) if x not in names]
    if missing:
        raise CompileError(f"the compiled segment's {EDGETPU_OP} uses tensors {missing[:4]} that "
                           f"the segment does not have")
    log.debug("edgetpu_compiler mapped %d operators into %d bytes", n, len(op.custom_options))
    return CompiledSegment(bytes(op.custom_options), ins, outs, report)


def _reasons(sg, cpu_ops: list[int], report: dict) -> dict[int, str]:
    # The log's table counts operators by (name, status); hand its non-mapped
    # statuses to the CPU operators of the same name, in execution order.
    left = [[r["operator"], r["count"], r["status"]] for r in report.get("operators", [])
            if r["status"] != MAPPED]
    out = {}
    for k in cpu_ops:
        name = sg.operators[k].name
        row = next((r for r in left if r[0] == name and r[1] > 0), None)
        if row is None:
            out[k] = LEFT_ON_CPU
            continue
        row[1] -= 1
        out[k] = row[2]
    return out
