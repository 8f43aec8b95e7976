"""One Edge TPU executable (a DWN1 ``Executable`` flatbuffer), decoded and checked.

:func:`read_executable` decodes the table, checks every index and size the
host driver later relies on (instruction chunks, parameter ranges, layer
names in the DMA hints, output layouts) and returns an :class:`Executable`
whose parameters and instruction chunks are memoryviews into the caller's
buffer.  Damage raises :class:`~coralrt.errors.ExecutableError`; enum values
and union tags coralrt does not know are kept as numbers and recorded in the
package's :class:`~coralrt._formats.dwn1_schema.Unknowns` (see
:func:`coralrt._formats.dwn1.check_runnable` for when they matter).

Executables of early compilers lay their ``Layer`` tables out differently
(``dwn1_schema.EARLY_LAYOUT``); they are recognised and re-read with that layout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from coralrt.errors import ExecutableError
from coralrt._formats.dwn1_layer import Layer, layer_from_table
from coralrt._formats.dwn1_schema import EARLY_LAYOUT, LAYOUT, UNIONS, UnknownEnum, Unknowns
from coralrt._model.flatbuf import DecodeBudget, FlatbufferError, decode_root

__all__ = ["FieldOffset", "DmaHint", "Executable", "read_executable", "decode_table", "view"]

log = logging.getLogger("coralrt.usb")


@dataclass(frozen=True)
class FieldOffset:
    """A bit position in an instruction chunk that the linker patches with an address.

    ``target`` and ``position`` are names, or numbers coralrt does not know
    (:class:`~coralrt._formats.dwn1_schema.UnknownEnum`).
    """

    target: str | UnknownEnum  # "output" | "input" | "parameter" | "scratch"
    batch: int
    name: str | None
    upper: bool  # True: the upper 32 bits of the address, else the lower
    offset_bit: int
    position: str | UnknownEnum = "LOWER_32BIT"


@dataclass(frozen=True)
class DmaHint:
    """One step of the transfer order the compiler recorded (``DmaHints.hints``).

    ``kind`` is "instruction", "input", "parameter", "output", "scratch",
    "interrupt" or "fence"; ``kind``, ``direction`` and ``interrupt`` are
    :class:`~coralrt._formats.dwn1_schema.UnknownEnum` numbers when the file
    holds a value coralrt does not know.
    """

    kind: str | UnknownEnum
    chunk: int | None = None  # instruction chunk index
    name: str | None = None  # layer name for input/output
    offset: int = 0
    size: int = 0  # bytes; for an instruction hint the chunk's length
    interrupt: int | None = None  # SCALAR_CORE_INT_n
    direction: str | UnknownEnum = "infeed"  # "infeed" (host -> device) | "outfeed"
    batch: int = 0


@dataclass
class Executable:
    """One compiled program: instructions, parameters, the DMA order and its layers.

    ``caching_token`` is ``parameter_caching_token``: a PARAMETER_CACHING
    executable and the EXECUTION_ONLY one it feeds share it, and so do models
    compiled together.  ``estimated_cycles`` prefers the 64-bit field.
    ``layer_format`` is "early" for the ``Layer`` tables of early compilers.
    """

    type: str | UnknownEnum  # "STAND_ALONE" | "PARAMETER_CACHING" | "EXECUTION_ONLY"
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
    layer_format: str = "current"

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


# ---------------------------------------------------------------------------
# flatbuffer helpers


def decode_table(buf, root: str, where: str, budget: DecodeBudget,
                 layout: dict = LAYOUT) -> dict:
    try:
        return decode_root(buf, root, layout, UNIONS, where=where, budget=budget)
    except FlatbufferError as e:
        raise ExecutableError(f"the {root} flatbuffer is malformed: {e}", where=where) from None


def view(arr) -> memoryview:
    return memoryview(b"") if arr is None else memoryview(arr)


# ---------------------------------------------------------------------------
# Executable


def _hint(h: dict, chunks: list, names: dict, params: int, where: str,
          unknowns: Unknowns) -> DmaHint:
    direction = unknowns.name("Direction", h.get("direction", 0), where, "DMA direction")
    tag, body = h.get("any_hint_type", 0), h.get("any_hint")
    member = UNIONS["AnyHint"].get(tag)
    if tag and member is None:
        return DmaHint(unknowns.name("AnyHint", tag, where, "DMA hint type"),
                       direction=direction)
    if body is None:
        raise ExecutableError(f"DMA hint type {tag} is unknown or missing", where=where)
    if member == "InstructionHint":
        c = body.get("instruction_chunk_index", 0)
        if not 0 <= c < len(chunks):
            raise ExecutableError(f"instruction chunk {c} does not exist (the executable "
                                  f"has {len(chunks)})", where=where)
        return DmaHint("instruction", chunk=c, size=len(chunks[c]), direction=direction)
    if member == "InterruptHint":
        t = body.get("type", 0)
        named = unknowns.name("InterruptType", t, where, "interrupt type")
        return DmaHint("interrupt", interrupt=named if isinstance(named, UnknownEnum) else t,
                       direction=direction)
    if member == "FenceHint":
        return DmaHint("fence", direction=direction)
    meta = body.get("meta") or {}
    kind = unknowns.name("Description", meta.get("desc", 0), where, "DMA descriptor target")
    off, size = body.get("offset_in_bytes", 0), body.get("size_in_bytes", 0)
    name = meta.get("name") or None
    if off < 0 or size < 0:
        raise ExecutableError(f"negative offset {off} or size {size}", where=where)
    if kind == "parameter" and off + size > params:
        raise ExecutableError(f"parameter bytes {off}..{off + size} are outside the "
                              f"{params}-byte parameter blob", where=where)
    layer_names = names.get(kind) if isinstance(kind, str) else None
    if layer_names is not None and name not in layer_names:
        raise ExecutableError(f"{kind} hint names {name!r}, which is not one of the "
                              f"executable's {kind} layers", where=where)
    known = isinstance(kind, str) and isinstance(direction, str)
    if known and (kind == "output") != (direction == "outfeed") and kind != "scratch":
        raise ExecutableError(f"{kind} hint has direction {direction}", where=where)
    return DmaHint(kind, name=name, offset=off, size=size, direction=direction,
                   batch=meta.get("batch", 0))


def _hints(d: dict | None, chunks: list, inputs, outputs, params: int, where: str,
           unknowns: Unknowns):
    names = {"input": {layer.name for layer in inputs},
             "output": {layer.name for layer in outputs}}
    hints = [_hint(h, chunks, names, params, f"{where}, dma hint {i}", unknowns)
             for i, h in enumerate((d or {}).get("hints") or [])]
    return hints, bool((d or {}).get("fully_deterministic", False))


def _field_offsets(chunk: dict, n_bits: int, where: str,
                   unknowns: Unknowns) -> list[FieldOffset]:
    out = []
    for j, f in enumerate(chunk.get("field_offsets") or []):
        meta = f.get("meta") or {}
        bit = f.get("offset_bit", 0)
        if not 0 <= bit <= n_bits - 32:
            raise ExecutableError(f"field offset {j} patches bits {bit}..{bit + 32} of a "
                                  f"{n_bits}-bit chunk", where=where)
        position = unknowns.name("Position", meta.get("position", 0), where,
                                 "field offset position")
        out.append(FieldOffset(
            unknowns.name("Description", meta.get("desc", 0), where, "field offset target"),
            meta.get("batch", 0), meta.get("name") or None, position == "UPPER_32BIT", bit,
            position))
    return out


def _early_layers(buf: memoryview, d: dict, where: str, budget: DecodeBudget) -> dict | None:
    """``d`` re-read with the early compilers' Layer table, or None when it is not one.

    Read with today's layout, every layer of such an executable lacks its
    ``AnyLayer`` table and shows the union tag (2 for inputs, 1 for outputs)
    in the low byte of ``data_type``; re-read, every layer must carry the
    member its role needs.  Inputs had no data type then (8-bit only); an
    output's is in its ``OutputLayer``.
    """
    roles = [(x, 2) for x in d.get("input_layers") or []] + \
        [(x, 1) for x in d.get("output_layers") or []]
    if not roles or any(x.get("any_layer") is not None or x.get("data_type", 0) & 0xFF != tag
                        for x, tag in roles):
        return None
    try:
        early = decode_root(buf, "Executable", EARLY_LAYOUT, UNIONS, where=where, budget=budget)
    except FlatbufferError:
        return None
    roles = [(x, 2) for x in early.get("input_layers") or []] + \
        [(x, 1) for x in early.get("output_layers") or []]
    if any(x.get("any_layer_type") != tag or x.get("any_layer") is None for x, tag in roles):
        return None
    for x, tag in roles:
        x["data_type"] = x["any_layer"].get("data_type", 0) if tag == 1 else 0
    log.info("%s: Layer tables of an early edgetpu_compiler (no data type field); inputs "
             "are read as 8-bit (FIXED_POINT8)", where)
    return early


def read_executable(buf: memoryview, where: str, budget: DecodeBudget,
                    unknowns: Unknowns) -> Executable:
    """Decode and check one serialized ``Executable`` (see the module docstring)."""
    d = decode_table(buf, "Executable", where, budget)
    early = _early_layers(buf, d, where, budget)
    d = d if early is None else early
    etype = unknowns.name("ExecutableType", d.get("type", 0), where, "executable type")
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
        v = view(c.get("bitstream"))
        chunks.append(v)
        offsets.append(_field_offsets(c, 8 * len(v), f"{where}, instruction chunk {i}",
                                      unknowns))
    if not chunks or not any(len(c) for c in chunks):
        raise ExecutableError("executable has no instructions", where=where)
    inputs = [layer_from_table(x, False, f"{where}, input {i}", budget, unknowns)
              for i, x in enumerate(d.get("input_layers") or [])]
    outputs = [layer_from_table(x, True, f"{where}, output {i}", budget, unknowns)
               for i, x in enumerate(d.get("output_layers") or [])]
    params = view(d.get("parameters"))
    hints, deterministic = _hints(d.get("dma_hints"), chunks, inputs, outputs, len(params),
                                  where, unknowns)
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
        field_offsets=offsets, layer_format="current" if early is None else "early")
