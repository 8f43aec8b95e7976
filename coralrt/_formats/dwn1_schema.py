"""The Edge TPU executable format (DWN1) at the byte level: the flatbuffer
layout, the readers its container needs, and the enums with their leniency.

The same (name, slot, kind, default) table format as ``coralrt._model._schema``
so the generic decoder in :mod:`coralrt._model.flatbuf` reads it.  Field order
and types follow libedgetpu's ``executable/executable.fbs`` (Apache-2.0); see
``shared/reference/executable-format.md``.  The enums are ``short`` there.

``TensorShape.dimension`` is a vector of the 8-byte struct ``Range{start,
end}``; the generic decoder has no struct vectors, so it is read as
``[int64]`` and split into (start, end) int32 pairs by the caller.
``MultiExecutable.serialized_executables`` is a vector of binary strings that
is read by :func:`binary_strings` (the decoder would insist on UTF-8), and the
``custom_options`` FlexBuffer map around the package by
:class:`~coralrt._formats.flexreader.FlexReader` (the ``flatbuffers.flexbuffers``
reader copies and does not check bounds).  Both raise
:class:`~coralrt.errors.ExecutableError` and return memoryviews, and both
charge the :class:`~coralrt._model.flatbuf.DecodeBudget` of the
``custom_options`` buffer that the nested flatbuffers draw from too, so a
package whose offsets repeat one value or one executable many times is refused
after work linear in its size.

Enum values and union tags outside the ones listed here (a newer compiler, or
a damaged byte) are not errors while decoding: :meth:`Unknowns.name` keeps
them as :class:`UnknownEnum` numbers and records one warning per field and
value; whoever needs the value refuses it (``dwn1.check_runnable``).

``EARLY_LAYOUT`` is the ``Layer`` table of early edgetpu_compiler versions
(seen in an "oldest"-layout ``beagle`` model): no ``data_type``, and the
``AnyLayer`` union in slots 6 and 7 where the current table has
``data_type`` and the union tag.  Read with today's layout, its union tag
looks like a data type (``0x2802``) and its union offset like a layer kind.
The layers of such an executable are re-read with this layout.
"""

from __future__ import annotations

import ast
import logging
import struct
from dataclasses import dataclass

from coralrt.errors import ExecutableError
from coralrt._model.flatbuf import DecodeBudget, compile_layout

__all__ = ["ENUMS", "TABLES", "UNIONS", "LAYOUT", "EARLY_LAYOUT", "IDENTIFIER",
           "binary_strings", "UnknownEnum", "UnknownValue", "Unknowns"]

log = logging.getLogger("coralrt.usb")

IDENTIFIER = b"DWN1"

ENUMS = {
    "Description": {0: "output", 1: "input", 2: "parameter", 3: "scratch"},
    "Position": {0: "LOWER_32BIT", 1: "UPPER_32BIT"},
    "InterruptType": {0: "SCALAR_CORE_INT_0", 1: "SCALAR_CORE_INT_1",
                      2: "SCALAR_CORE_INT_2", 3: "SCALAR_CORE_INT_3"},
    "Direction": {0: "infeed", 1: "outfeed"},
    "DataType": {0: "FIXED_POINT8", 1: "FIXED_POINT16", 2: "SIGNED_FIXED_POINT32", 3: "BFLOAT",
                 4: "HALF", 5: "SINGLE", 8: "SIGNED_FIXED_POINT8", 9: "SIGNED_FIXED_POINT16"},
    "ExecutableType": {0: "STAND_ALONE", 1: "PARAMETER_CACHING", 2: "EXECUTION_ONLY"},
}

UNIONS = {
    "AnyHint": {1: "DmaDescriptorHint", 2: "InstructionHint", 3: "InterruptHint",
                4: "FenceHint"},
    "AnyLayer": {1: "OutputLayer", 2: "InputLayer"},
}

# Fields in slot order: "name:kind", "name:kind=default" (a Python literal), or
# "name:kind?" for a scalar whose absence matters (default None).  Other scalars
# default to 0 / False, strings, vectors and tables to None.
_SPEC = {
    "Meta": "desc:int16 batch:int32 name:string position:int16",
    "FieldOffset": "meta:Meta offset_bit:int32",
    "InstructionBitstream": "bitstream:[uint8] field_offsets:[FieldOffset]",
    "DmaDescriptorHint": "meta:Meta offset_in_bytes:int32 size_in_bytes:int32",
    "InterruptHint": "type:int16",
    "InstructionHint": "instruction_chunk_index:int32",
    "FenceHint": "",
    "DmaHint": "any_hint_type:utype any_hint:union:AnyHint direction:int16",
    "DmaHints": "hints:[DmaHint] fully_deterministic:bool",
    "OutputLayout": "y_coordinate_to_linear_tile_id_map:[int32] "
                    "x_coordinate_to_linear_tile_id_map:[int32] "
                    "linearized_tile_byte_offset:[int32] "
                    "x_coordinate_to_local_byte_offset:[int32] "
                    "y_coordinate_to_local_y_offset:[int32] "
                    "x_coordinate_to_local_y_row_size:[int32]",
    "TensorShape": "dimension:[int64]",  # [Range]: see the module docstring
    "TensorLayout": "shape:TensorShape stride:[int32]",
    "OutputShapeInfo": "slice_layout:[TensorLayout] slice_offset:[int32]",
    "NumericsConstants": "zero_point:int32 dequantization_factor:float32",
    "OutputLayer": "layout:OutputLayout data_type:int16 shape_info:OutputShapeInfo",
    "InputLayer": "",
    "Layer": "name:string size_bytes:int32 y_dim:int32 x_dim:int32 z_dim:int32 "
             "numerics:NumericsConstants data_type:int16 any_layer_type:utype "
             "any_layer:union:AnyLayer execution_count_per_inference:int32=1 cache_on_dram:bool "
             "shape:TensorShape",
    "Executable": "version:int32 name:string serialized_model:[uint8] batch_size:int32 "
                  "scratch_size_bytes:int32 instruction_bitstreams:[InstructionBitstream] "
                  "parameters:[uint8] dma_hints:DmaHints input_layers:[Layer] "
                  "output_layers:[Layer] chip:string estimated_cycles:int32? "
                  "used_narrow_memory_bytes_per_tile:int32 type:int16 "
                  "parameter_caching_token:uint64 use_tpu_dram_for_parameters:bool "
                  "estimated_cycles_64bit:int64?",
    "MultiExecutable": "serialized_executables:[string]",  # read by binary_strings()
    "SerializedPackage": "serialized_package:[uint8]",
    "Package": "min_runtime_version:int32 serialized_multi_executable:[uint8] signature:[uint8] "
               "keypair_version:int32 compiler_version:string virtual_chip_id:int32 "
               "multi_chip_package:[SerializedPackage] model_identifier:string",
}
_SCALAR_DEFAULTS = {"bool": False, "float32": 0.0, "int16": 0, "int32": 0, "int64": 0,
                    "uint64": 0, "utype": 0}


def _field(slot: int, item: str) -> tuple:
    name, kind = item.split(":", 1)
    kind, _, literal = kind.partition("=")
    if kind.endswith("?"):
        return (name, slot, kind[:-1], None)
    default = ast.literal_eval(literal) if literal else _SCALAR_DEFAULTS.get(kind)
    return (name, slot, kind, default)


def _table(spec: str) -> tuple:
    return tuple(_field(i, f) for i, f in enumerate(spec.split()))


TABLES = {name: _table(spec) for name, spec in _SPEC.items()}
LAYOUT = compile_layout(TABLES)
# Early compilers: Layer without data_type (see the module docstring).
EARLY_LAYOUT = compile_layout({**TABLES, "Layer": _table(
    "name:string size_bytes:int32 y_dim:int32 x_dim:int32 z_dim:int32 "
    "numerics:NumericsConstants any_layer_type:utype any_layer:union:AnyLayer")})


def binary_strings(buf: memoryview, where: str, budget: DecodeBudget | None = None
                   ) -> list[memoryview]:
    """``MultiExecutable.serialized_executables`` as views (binary [string] vector).

    Each view costs one unit of ``budget``; the executables they hold are
    decoded from the same budget by the caller.
    """
    n, u32 = len(buf), struct.Struct("<I")

    def at(pos: int, what: str) -> int:
        if pos < 0 or pos + 4 > n:
            raise ExecutableError(f"{what} at {pos} is outside the {n}-byte MultiExecutable",
                                  where=where)
        return u32.unpack_from(buf, pos)[0]

    root = at(0, "root offset")
    vt = root - struct.unpack("<i", struct.pack("<I", at(root, "table")))[0]
    vt_len = at(vt, "vtable") & 0xFFFF
    field_off = (at(vt + 4, "vtable entry") & 0xFFFF) if vt_len >= 6 else 0
    if not field_off:
        return []
    vec = root + field_off + at(root + field_off, "vector offset")
    count = at(vec, "vector length")
    if vec + 4 + 4 * count > n:
        raise ExecutableError(f"{count} executables do not fit in the MultiExecutable",
                              where=where)
    if budget is not None:
        budget.left -= 1 + count
        if budget.left < 0:
            raise ExecutableError(f"{count} executables exceed the decoding budget of the "
                                  f"{budget.nbytes}-byte package", where=where)
    out = []
    for i in range(count):
        pos = vec + 4 + 4 * i
        s = pos + at(pos, f"executable {i} offset")
        length = at(s, f"executable {i} length")
        if s + 4 + length > n:
            raise ExecutableError(f"executable {i} ({length} bytes) runs past the end",
                                  where=where)
        out.append(buf[s + 4:s + 4 + length])
    return out


# ---------------------------------------------------------------------------
# enums: unknown values are kept


class UnknownEnum(int):
    """An enum value or union tag that coralrt's schema does not name, kept as its number.

    It is an ``int`` (equal to the number; JSON writes the number) whose
    ``str`` and ``repr`` read like ``DataType(17)``.  ``enum`` names the enum
    or union.
    """

    def __new__(cls, enum: str, value: int):
        self = super().__new__(cls, value)
        self.enum = enum
        return self

    def __getnewargs__(self):
        return self.enum, int(self)

    def __repr__(self) -> str:
        return f"{self.enum}({int(self)})"

    __str__ = __repr__


@dataclass(frozen=True)
class UnknownValue:
    """One field's unknown value in a package: the first place it was met, and how often."""

    field: str  # "data type", "executable type", ...
    value: UnknownEnum
    where: str
    count: int = 1

    def __str__(self) -> str:
        more = f"; {self.count - 1} more place(s) have it" if self.count > 1 else ""
        return (f"{self.where}: {self.field} {int(self.value)} is not one coralrt knows "
                f"(kept as {self.value!r}{more})")


class Unknowns:
    """The unknown enum values met while decoding one package, one entry per field and value."""

    MAX_LOGGED = 8

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, int], UnknownValue] = {}

    def name(self, enum: str, value: int, where: str, what: str) -> str | UnknownEnum:
        """The name of ``value`` in ``enum`` (an enum or a union), else the number, recorded."""
        names = ENUMS.get(enum) or UNIONS[enum]
        known = names.get(value)
        if known is not None:
            return known
        key = (what, enum, value)
        seen = self._seen.get(key)
        self._seen[key] = UnknownValue(what, UnknownEnum(enum, value), where) if seen is None \
            else UnknownValue(seen.field, seen.value, seen.where, seen.count + 1)
        return self._seen[key].value

    @property
    def values(self) -> list[UnknownValue]:
        return list(self._seen.values())

    def warn(self) -> None:
        """One log warning per field and value (at most ``MAX_LOGGED``, then a count)."""
        values = self.values
        for v in values[:self.MAX_LOGGED]:
            log.warning("%s", v)
        if len(values) > self.MAX_LOGGED:
            log.warning("... and %d more unknown enum values in the same package",
                        len(values) - self.MAX_LOGGED)
