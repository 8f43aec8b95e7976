"""Edge TPU executables (DWN1) inside an ``edgetpu-custom-op``.

:func:`parse_package` reads an operator's ``custom_options`` (a FlexBuffer
map) in the three layouts edgetpu_compiler has produced:

* ``"current"``: keys 1, 4, 5, 6, 7; key 4 is a ``Package`` flatbuffer;
* ``"older"``: keys 1, 4, 5 only (no chip list);
* ``"oldest"``: keys 1, 2, 3, 4 where 4 (and 3, a separate parameter-caching
  executable) are bare ``Executable`` flatbuffers with no ``Package``.

It checks what libedgetpu checks when it registers a package
(``driver/package_registry.cc``: runtime version, multi-chip packages, the
allowed executable combinations, batch size >= 1) plus every index and size
the host driver later relies on, so a damaged package fails here with
:class:`~coralrt.errors.ExecutableError` instead of in the middle of a USB
transfer.  Parameters and instruction bitstreams are zero-copy memoryviews
into the caller's buffer.  The FlexBuffer, the Package and every Executable
draw from one :class:`~coralrt.model.flatbuf.DecodeBudget` sized by the
``custom_options`` bytes, so parsing stays linear in them however the offsets
inside repeat one table or one executable.  Field meanings:
``shared/reference/edgetpu-stack.md`` section 2.  Nothing here needs a device.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

from coralrt.errors import ExecutableError
from coralrt.model.flatbuf import DecodeBudget, FlatbufferError, decode_root
from coralrt.formats.flexreader import FlexReader
from coralrt.formats.dwn1_schema import (
    IDENTIFIER, LAYOUT, UNIONS, Layer, OutputLayout, TensorSlice, binary_strings,
    enum_name, layer_from_table,
)

__all__ = ["Package", "Executable", "DmaHint", "FieldOffset", "Layer", "OutputLayout",
           "TensorSlice", "parse_package",
           "select_executables", "describe", "RUNTIME_VERSION", "MIN_VALID_RUNTIME_VERSION"]

log = logging.getLogger("coralrt.usb")

RUNTIME_VERSION = 14  # libedgetpu api/runtime_version.h kCurrent (kCoralGrouperRelease)
MIN_VALID_RUNTIME_VERSION = 10  # below this libedgetpu only warns


@dataclass(frozen=True)
class FieldOffset:
    """A bit position in an instruction chunk that the linker patches with an address."""

    target: str  # "output" | "input" | "parameter" | "scratch"
    batch: int
    name: str | None
    upper: bool  # True: the upper 32 bits of the address, else the lower
    offset_bit: int


@dataclass(frozen=True)
class DmaHint:
    """One step of the transfer order the compiler recorded (``DmaHints.hints``).

    ``kind`` is "instruction", "input", "parameter", "output", "scratch",
    "interrupt" or "fence".
    """

    kind: str
    chunk: int | None = None  # instruction chunk index
    name: str | None = None  # layer name for input/output
    offset: int = 0
    size: int = 0  # bytes; for an instruction hint the chunk's length
    interrupt: int | None = None  # SCALAR_CORE_INT_n
    direction: str = "infeed"  # "infeed" (host -> device) | "outfeed"
    batch: int = 0


@dataclass
class Executable:
    """One compiled program: instructions, parameters, the DMA order and its layers.

    ``caching_token`` is ``parameter_caching_token``: a PARAMETER_CACHING
    executable and the EXECUTION_ONLY one it feeds share it, and so do models
    compiled together.  ``estimated_cycles`` prefers the 64-bit field.
    """

    type: str  # "STAND_ALONE" | "PARAMETER_CACHING" | "EXECUTION_ONLY"
    batch_size: int
    parameters: memoryview
    instructions: list[memoryview]
    dma_hints: list[DmaHint]
    fully_deterministic: bool
    inputs: list[Layer]
    outputs: list[Layer]
    caching_token: int
    chip: str
    estimated_cycles: int | None
    name: str = ""
    version: int = 0
    scratch_size_bytes: int = 0
    used_narrow_memory_bytes_per_tile: int = 0
    use_tpu_dram_for_parameters: bool = False
    field_offsets: list[list[FieldOffset]] = field(default_factory=list)

    @property
    def parameters_bytes(self) -> int:
        return len(self.parameters)

    @property
    def instruction_bytes(self) -> int:
        return sum(len(c) for c in self.instructions)

    def hinted_bytes(self, layer_name: str) -> int:
        """Bytes the DMA hints move for a layer (the largest offset + size), or 0.

        An input is zero-padded up to this size before it is sent.
        """
        return max((h.offset + h.size for h in self.dma_hints if h.name == layer_name),
                   default=0)


@dataclass
class Package:
    """The contents of one ``edgetpu-custom-op``; ``layout`` names the custom_options form."""

    min_runtime_version: int
    compiler_version: str
    model_identifier: str
    executables: list[Executable]
    layout: str  # "current" | "older" | "oldest"
    keypair_version: int = 0
    virtual_chip_id: int = 0
    signature_bytes: int = 0
    custom_op_version: int = 0
    execution_preference: int | None = None
    chip_ids: list[int] | None = None  # key "6": libedgetpu's internal chip enum per package


# ---------------------------------------------------------------------------
# flatbuffer helpers


def _decode(buf, root: str, where: str, budget: DecodeBudget) -> dict:
    try:
        return decode_root(buf, root, LAYOUT, UNIONS, where=where, budget=budget)
    except FlatbufferError as e:
        raise ExecutableError(f"the {root} flatbuffer is malformed: {e}", where=where) from None


def _view(arr) -> memoryview:
    return memoryview(b"") if arr is None else memoryview(arr)


# ---------------------------------------------------------------------------
# Executable


def _hints(d: dict | None, chunks: list, inputs, outputs, params: int, where: str):
    hints: list[DmaHint] = []
    in_names = {layer.name for layer in inputs}
    out_names = {layer.name for layer in outputs}
    for i, h in enumerate((d or {}).get("hints") or []):
        w = f"{where}, dma hint {i}"
        direction = enum_name("Direction", h.get("direction", 0), w, "DMA direction")
        tag, body = h.get("any_hint_type", 0), h.get("any_hint")
        if body is None:
            raise ExecutableError(f"DMA hint type {tag} is unknown or missing", where=w)
        member = UNIONS["AnyHint"][tag]
        if member == "InstructionHint":
            c = body.get("instruction_chunk_index", 0)
            if not 0 <= c < len(chunks):
                raise ExecutableError(f"instruction chunk {c} does not exist (the executable "
                                      f"has {len(chunks)})", where=w)
            hints.append(DmaHint("instruction", chunk=c, size=len(chunks[c]),
                                 direction=direction))
        elif member == "InterruptHint":
            t = body.get("type", 0)
            enum_name("InterruptType", t, w, "interrupt type")
            hints.append(DmaHint("interrupt", interrupt=t, direction=direction))
        elif member == "FenceHint":
            hints.append(DmaHint("fence", direction=direction))
        else:
            meta = body.get("meta") or {}
            kind = enum_name("Description", meta.get("desc", 0), w, "DMA descriptor target")
            off, size = body.get("offset_in_bytes", 0), body.get("size_in_bytes", 0)
            name = meta.get("name") or None
            if off < 0 or size < 0:
                raise ExecutableError(f"negative offset {off} or size {size}", where=w)
            if kind == "parameter" and off + size > params:
                raise ExecutableError(f"parameter bytes {off}..{off + size} are outside the "
                                      f"{params}-byte parameter blob", where=w)
            names = {"input": in_names, "output": out_names}.get(kind)
            if names is not None and name not in names:
                raise ExecutableError(f"{kind} hint names {name!r}, which is not one of the "
                                      f"executable's {kind} layers", where=w)
            if (kind == "output") != (direction == "outfeed") and kind != "scratch":
                raise ExecutableError(f"{kind} hint has direction {direction}", where=w)
            hints.append(DmaHint(kind, name=name, offset=off, size=size, direction=direction,
                                 batch=meta.get("batch", 0)))
    return hints, bool((d or {}).get("fully_deterministic", False))


def _field_offsets(chunk: dict, n_bits: int, where: str) -> list[FieldOffset]:
    out = []
    for j, f in enumerate(chunk.get("field_offsets") or []):
        meta = f.get("meta") or {}
        bit = f.get("offset_bit", 0)
        if not 0 <= bit <= n_bits - 32:
            raise ExecutableError(f"field offset {j} patches bits {bit}..{bit + 32} of a "
                                  f"{n_bits}-bit chunk", where=where)
        out.append(FieldOffset(
            enum_name("Description", meta.get("desc", 0), where, "field offset target"),
            meta.get("batch", 0), meta.get("name") or None, meta.get("position", 0) == 1, bit))
    return out


def _executable(buf: memoryview, where: str, budget: DecodeBudget) -> Executable:
    d = _decode(buf, "Executable", where, budget)
    etype = enum_name("ExecutableType", d.get("type", 0), where, "executable type")
    where = f"{where} ({etype})"
    batch = d.get("batch_size", 0)
    if batch < 1:
        raise ExecutableError(f"executable has invalid batch size {batch}; it must be >= 1",
                              where=where)
    for key in ("scratch_size_bytes", "used_narrow_memory_bytes_per_tile"):
        if d.get(key, 0) < 0:
            raise ExecutableError(f"{key} is negative ({d[key]})", where=where)
    chunks, offsets = [], []
    for i, c in enumerate(d.get("instruction_bitstreams") or []):
        view = _view(c.get("bitstream"))
        chunks.append(view)
        offsets.append(_field_offsets(c, 8 * len(view), f"{where}, instruction chunk {i}"))
    if not chunks or not any(len(c) for c in chunks):
        raise ExecutableError("executable has no instructions", where=where)
    inputs = [layer_from_table(x, False, f"{where}, input {i}", budget)
              for i, x in enumerate(d.get("input_layers") or [])]
    outputs = [layer_from_table(x, True, f"{where}, output {i}", budget)
               for i, x in enumerate(d.get("output_layers") or [])]
    params = _view(d.get("parameters"))
    hints, deterministic = _hints(d.get("dma_hints"), chunks, inputs, outputs, len(params),
                                  where)
    token = d.get("parameter_caching_token", 0)
    if etype == "PARAMETER_CACHING" and token == 0:
        raise ExecutableError("parameter-caching executable has caching token 0", where=where)
    cycles = d.get("estimated_cycles_64bit")
    return Executable(
        type=etype, batch_size=batch, parameters=params, instructions=chunks, dma_hints=hints,
        fully_deterministic=deterministic, inputs=inputs, outputs=outputs,
        caching_token=token, chip=d.get("chip") or "", name=d.get("name") or "",
        estimated_cycles=cycles if cycles is not None else d.get("estimated_cycles"),
        version=d.get("version", 0), scratch_size_bytes=d.get("scratch_size_bytes", 0),
        used_narrow_memory_bytes_per_tile=d.get("used_narrow_memory_bytes_per_tile", 0),
        use_tpu_dram_for_parameters=bool(d.get("use_tpu_dram_for_parameters", False)),
        field_offsets=offsets)


_TYPES = ("STAND_ALONE", "PARAMETER_CACHING", "EXECUTION_ONLY")
_ALLOWED = ({"STAND_ALONE"}, {"PARAMETER_CACHING"}, {"EXECUTION_ONLY"},
            {"PARAMETER_CACHING", "EXECUTION_ONLY"},
            {"PARAMETER_CACHING", "EXECUTION_ONLY", "STAND_ALONE"})


def _check_combination(executables: list[Executable]) -> None:
    types = [e.type for e in executables]
    if len(set(types)) != len(types):
        raise ExecutableError(f"multiple executables of the same type in the package: {types}")
    if set(types) not in _ALLOWED:
        raise ExecutableError(f"invalid combination of executables in the package: {types}; "
                              f"libedgetpu accepts one executable, PARAMETER_CACHING + "
                              f"EXECUTION_ONLY, or those two + STAND_ALONE")


# ---------------------------------------------------------------------------
# public API


def parse_package(custom_options) -> Package:
    """Parse an ``edgetpu-custom-op``'s ``custom_options`` into a :class:`Package`.

    Accepts any bytes-like object; parameters and instruction chunks of the
    result are views into it (keep it alive and unchanged while they are used).
    Raises :class:`~coralrt.errors.ExecutableError` for every defect.
    """
    try:
        buf = memoryview(custom_options).cast("B")
    except TypeError as e:
        raise ExecutableError(f"custom_options must be bytes-like ({e})") from None
    try:
        return _parse(buf, DecodeBudget(len(buf)))
    except (struct.error, IndexError, OverflowError, UnicodeDecodeError) as e:
        # The readers check bounds first; this is a last guard for the unforeseen.
        raise ExecutableError(f"malformed executable package ({type(e).__name__}: {e})") from None


def _parse(buf: memoryview, budget: DecodeBudget) -> Package:
    # One budget for everything nested in ``buf``: the package and the
    # executables are slices of it, so a valid package spends a fraction of it.
    opts = FlexReader(buf, budget).root_map()
    blob = opts.get("4")
    if not isinstance(blob, memoryview):
        raise ExecutableError("custom_options has no serialized executable under key \"4\"",
                              where="custom_options")
    version = opts.get("1", 0)
    preference = opts.get("5")
    common = dict(custom_op_version=version if isinstance(version, int) else 0,
                  execution_preference=preference if isinstance(preference, int) else None)
    if blob[4:8] != IDENTIFIER and ("2" in opts or "3" in opts):
        return _oldest(opts, blob, common, budget)
    chips = opts.get("6")
    layout = "older" if chips is None else "current"
    if chips is not None:
        extra = opts.get("7") or []
        if not isinstance(chips, list) or not chips or not all(isinstance(c, int) for c in chips):
            raise ExecutableError("key \"6\" (chip per package) is not a non-empty list of "
                                  "integers", where="custom_options")
        if not isinstance(extra, list) or len(chips) != len(extra) + 1:
            raise ExecutableError(f"key \"6\" lists {len(chips)} chips but there are "
                                  f"{1 + len(extra) if isinstance(extra, list) else '?'} "
                                  f"packages", where="custom_options")
        if extra:
            raise ExecutableError(f"the custom op carries {len(chips)} packages (key \"7\"); "
                                  f"like libedgetpu's direct runtime, only one is supported",
                                  where="custom_options")
    if blob[4:8] != IDENTIFIER:
        log.warning("package file identifier %r is not %r", bytes(blob[4:8]), IDENTIFIER)
    pkg = _decode(blob, "Package", "package", budget)
    mrv = pkg.get("min_runtime_version", 0)
    if mrv > RUNTIME_VERSION:
        raise ExecutableError(f"package requires runtime version {mrv}, which is newer than "
                              f"this runtime's version {RUNTIME_VERSION}", where="package")
    if mrv < MIN_VALID_RUNTIME_VERSION:
        log.warning("package minimum runtime version %d is lower than expected (%d)", mrv,
                    MIN_VALID_RUNTIME_VERSION)
    if pkg.get("virtual_chip_id", 0) == -1:
        raise ExecutableError("this is a multi-chip package, which is not supported",
                              where="package")
    multi = _view(pkg.get("serialized_multi_executable"))
    if not len(multi):
        raise ExecutableError("no executables to register (empty multi-executable)",
                              where="package")
    blobs = binary_strings(multi, "package.multi_executable", budget)
    if not blobs:
        raise ExecutableError("no executables provided", where="package.multi_executable")
    if len(blobs) > len(_TYPES):
        # _check_combination refuses these anyway (a type repeats); say so
        # before decoding them.
        raise ExecutableError(f"the package holds {len(blobs)} executables; libedgetpu "
                              f"accepts at most one of each of the {len(_TYPES)} types",
                              where="package.multi_executable")
    exes = [_executable(b, f"executable {i}", budget) for i, b in enumerate(blobs)]
    _check_combination(exes)
    signature = pkg.get("signature")
    return Package(
        min_runtime_version=mrv, compiler_version=pkg.get("compiler_version") or "",
        model_identifier=pkg.get("model_identifier") or "", executables=exes, layout=layout,
        keypair_version=pkg.get("keypair_version", 0),
        virtual_chip_id=pkg.get("virtual_chip_id", 0),
        signature_bytes=0 if signature is None else len(signature), chip_ids=chips, **common)


def _oldest(opts: dict, blob: memoryview, common: dict, budget: DecodeBudget) -> Package:
    # Bare executables, no Package.  Key "3" held the parameter-caching half:
    # libedgetpu now ignores it, but the main executable then lacks its
    # parameters, so keep the pair (the main one runs as EXECUTION_ONLY).
    main = _executable(blob, "executable 0", budget)
    exes = [main]
    pc_blob = opts.get("3")
    if isinstance(pc_blob, memoryview) and len(pc_blob):
        pc = _executable(pc_blob, "executable 1", budget)
        if pc.type == "STAND_ALONE":
            pc.type = "PARAMETER_CACHING"
        if main.type == "STAND_ALONE":
            main.type = "EXECUTION_ONLY"
        exes.append(pc)
    _check_combination(exes)
    chip = opts.get("2")
    if isinstance(chip, memoryview):
        name = bytes(chip).decode("utf-8", "replace")
        for e in exes:
            e.chip = e.chip or name
    return Package(min_runtime_version=0, compiler_version="", model_identifier="",
                   executables=exes, layout="oldest", **common)


def select_executables(package: Package) -> tuple[Executable | None, Executable]:
    """(parameter-caching executable or None, executable to run), as libedgetpu picks them.

    One executable: it runs whatever its type says.  Two: PARAMETER_CACHING
    then EXECUTION_ONLY.  Three: the STAND_ALONE one, with no caching.
    """
    exes = package.executables
    if exes:
        _check_combination(exes)
    by_type = {e.type: e for e in exes}
    if len(exes) == 1:
        return None, exes[0]
    if len(exes) == 2:
        return by_type["PARAMETER_CACHING"], by_type["EXECUTION_ONLY"]
    if len(exes) == 3:
        return None, by_type["STAND_ALONE"]
    raise ExecutableError("the package has no executables")


def _layer_dict(layer: Layer) -> dict:
    return {"name": layer.name, "shape": list(layer.shape), "dtype": layer.dtype,
            "zero_point": layer.zero_point, "scale": layer.scale,
            "size_bytes": layer.size_bytes, "data_type": layer.data_type}


def describe(package: Package) -> dict:
    """A JSON-ready summary of the package (``coralrt inspect --json``, key "edgetpu")."""
    pc, main = select_executables(package)
    exes = []
    for e in package.executables:
        kinds: dict[str, int] = {}
        for h in e.dma_hints:
            kinds[h.kind] = kinds.get(h.kind, 0) + 1
        exes.append({
            "type": e.type, "role": "run" if e is main else ("cache" if e is pc else "unused"),
            "batch_size": e.batch_size, "chip": e.chip, "caching_token": e.caching_token,
            "parameters_bytes": e.parameters_bytes, "instruction_bytes": e.instruction_bytes,
            "instruction_chunks": [len(c) for c in e.instructions],
            "scratch_bytes": e.scratch_size_bytes, "estimated_cycles": e.estimated_cycles,
            "fully_deterministic": e.fully_deterministic, "dma_hints": kinds,
            "inputs": [_layer_dict(x) for x in e.inputs],
            "outputs": [_layer_dict(x) for x in e.outputs],
        })
    return {"layout": package.layout, "min_runtime_version": package.min_runtime_version,
            "compiler_version": package.compiler_version,
            "model_identifier": package.model_identifier, "executables": exes}
