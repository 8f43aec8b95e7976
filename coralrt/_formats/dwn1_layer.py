"""Inputs and outputs of an Edge TPU executable (DWN1 ``Layer`` tables) and
what the host must do with their bytes (edgetpu-stack.md section 2.6, after
libedgetpu ``api/layer_information.cc``): padding, the XOR of signed data,
and the relayout of tiled outputs.

:func:`layer_from_table` turns a decoded ``Layer`` table into a checked
:class:`Layer`.  A ``data_type`` or layer kind outside the enums coralrt knows
is kept as an :class:`~coralrt._formats.dwn1_schema.UnknownEnum` (and reported
through the package's :class:`~coralrt._formats.dwn1_schema.Unknowns`); the
checks that need it (the element size) are skipped, and loading the package
refuses such a layer (:func:`coralrt._formats.dwn1.check_runnable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coralrt.errors import ExecutableError
from coralrt._formats.dwn1_schema import UnknownEnum, Unknowns
from coralrt._model.flatbuf import DecodeBudget

__all__ = ["Layer", "OutputLayout", "TensorSlice", "layer_from_table"]

# DataType -> (host dtype, bytes per element)
_DTYPES = {
    "FIXED_POINT8": ("uint8", 1), "FIXED_POINT16": ("uint16", 2),
    "SIGNED_FIXED_POINT32": ("int32", 4), "BFLOAT": ("bfloat16", 2), "HALF": ("float16", 2),
    "SINGLE": ("float32", 4), "SIGNED_FIXED_POINT8": ("int8", 1),
    "SIGNED_FIXED_POINT16": ("int16", 2),
}
# The TPU works in offset binary: the host XORs 0x80 into the top byte of each
# signed element, and the executable's zero point is the host's plus this.
_SIGN_OFFSET = {"SIGNED_FIXED_POINT8": 128, "SIGNED_FIXED_POINT16": 32768}


@dataclass(frozen=True, eq=False)
class OutputLayout:
    """Where output element (y, x, z) lies in the device's tiled buffer, in elements.

    The fields are the ``OutputLayout`` vectors of the executable, unchanged.
    """

    y_coordinate_to_linear_tile_id_map: np.ndarray
    x_coordinate_to_linear_tile_id_map: np.ndarray
    linearized_tile_byte_offset: np.ndarray
    x_coordinate_to_local_byte_offset: np.ndarray
    y_coordinate_to_local_y_offset: np.ndarray
    x_coordinate_to_local_y_row_size: np.ndarray

    def index(self, y: int, x: int, z: int = 0) -> int:
        """Element index of (y, x, z) in the raw output (libedgetpu ``GetBufferIndex``)."""
        return int(self.row_starts(slice(y, y + 1), slice(x, x + 1))[0, 0]) + z

    def row_starts(self, ys=slice(None), xs=slice(None)) -> np.ndarray:
        """Index of (y, x, 0) for every y in ``ys`` and x in ``xs`` (a 2-D int64 array)."""
        ty = self.y_coordinate_to_linear_tile_id_map[ys].astype(np.int64)
        tx = self.x_coordinate_to_linear_tile_id_map[xs].astype(np.int64)
        ly = self.y_coordinate_to_local_y_offset[ys].astype(np.int64)
        row = self.x_coordinate_to_local_y_row_size[xs].astype(np.int64)
        base = self.linearized_tile_byte_offset.astype(np.int64)[ty[:, None] + tx[None, :]]
        return base + ly[:, None] * row[None, :] + \
            self.x_coordinate_to_local_byte_offset[xs].astype(np.int64)[None, :]


@dataclass(frozen=True)
class TensorSlice:
    """One slice of ``OutputShapeInfo``: inclusive ranges, strides (elements), byte offset."""

    ranges: tuple[tuple[int, int], ...]
    stride: tuple[int, ...]
    offset: int

    @property
    def packed(self) -> bool:
        # Row-major strides, innermost last, compared right to left so the
        # work stays linear in the rank (which comes from the file).
        if len(self.stride) != len(self.ranges):
            return False
        step = 1
        for (s, e), stride in zip(reversed(self.ranges), reversed(self.stride)):
            if stride != step:
                return False
            step *= e - s + 1
        return True


@dataclass(frozen=True, eq=False)
class Layer:
    """An input or output of an executable, with what the host needs to move its data.

    ``zero_point`` is the host-side (TFLite) zero point; ``raw_zero_point``
    is the executable's, which for signed types is offset by 128 or 32768.
    ``data_type`` and ``kind`` (the ``AnyLayer`` member) are names, or an
    :class:`~coralrt._formats.dwn1_schema.UnknownEnum` when the value is not
    one coralrt knows (then ``dtype`` is None).
    ``shape`` comes from the executable's TensorShape when it has one, else
    it is (y_dim, x_dim, z_dim).  ``padded_z`` (outputs with a y-x layout) is
    the element distance between neighbouring x positions in the raw output.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str | None
    zero_point: int
    scale: float
    size_bytes: int
    x_dim: int
    y_dim: int
    z_dim: int
    padded_z: int | None = None
    data_type: str | UnknownEnum = "FIXED_POINT8"
    raw_zero_point: int = 0
    execution_count: int = 1
    cache_on_dram: bool = False
    is_output: bool = False
    layout: OutputLayout | None = None
    slices: tuple[TensorSlice, ...] | None = None
    kind: str | UnknownEnum = ""

    @property
    def element_size(self) -> int:
        known = _DTYPES.get(self.data_type)
        if known is None:
            raise ExecutableError(f"data type {int(self.data_type)} is not one coralrt knows",
                                  where=f"layer {self.name!r}")
        return known[1]

    @property
    def signed(self) -> bool:
        """True when the host XORs 0x80 into each element's top byte (in and out)."""
        return self.data_type in _SIGN_OFFSET

    @property
    def element_count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def actual_size_bytes(self) -> int:
        return self.element_count * self.element_size * self.execution_count

    @property
    def padded_size_bytes(self) -> int:
        return self.size_bytes * self.execution_count

    @property
    def needs_relayout(self) -> bool:
        """libedgetpu ``NeedsRelayout``: not one packed slice of shape information."""
        if not self.is_output:
            return False
        return not self.slices or len(self.slices) > 1 or not self.slices[0].packed

    @property
    def is_variable_output(self) -> bool:
        """LSTM state written back into the input of the same name (minus the suffix)."""
        return self.is_output and self.name.endswith("_variable_output")


def _ranges(shape: dict | None, where: str) -> tuple[tuple[int, int], ...] | None:
    dims = (shape or {}).get("dimension")
    if dims is None:
        return None
    pairs = tuple((int(s), int(e)) for s, e in dims.view("<i4").reshape(-1, 2))
    for s, e in pairs:
        if s < 0 or e < s:
            raise ExecutableError(f"tensor shape range [{s}, {e}] is invalid", where=where)
    return pairs


def _check_layout(lay: OutputLayout, y: int, x: int, z: int, limit: int, where: str,
                  budget: DecodeBudget | None = None) -> None:
    vecs = vars(lay)
    for name, n in (("y_coordinate_to_linear_tile_id_map", y),
                    ("y_coordinate_to_local_y_offset", y),
                    ("x_coordinate_to_linear_tile_id_map", x),
                    ("x_coordinate_to_local_byte_offset", x),
                    ("x_coordinate_to_local_y_row_size", x)):
        if len(vecs[name]) < n:
            raise ExecutableError(f"output layout {name} has {len(vecs[name])} entries for a "
                                  f"dimension of {n}", where=where)
    ty = lay.y_coordinate_to_linear_tile_id_map[:y].astype(np.int64)
    tx = lay.x_coordinate_to_linear_tile_id_map[:x].astype(np.int64)
    lo, hi = int(ty.min()) + int(tx.min()), int(ty.max()) + int(tx.max())
    if lo < 0 or hi >= len(lay.linearized_tile_byte_offset):
        raise ExecutableError(f"output layout tile ids {lo}..{hi} are outside the "
                              f"{len(lay.linearized_tile_byte_offset)} tiles", where=where)
    # Every start (row_starts) is base[ty[y] + tx[x]] + ly[y] * row[x] + xo[x].
    # Among the rows of one tile id it is linear in ly[y], so its extremes lie
    # at that tile's smallest and largest ly: checking those for every x gives
    # the exact min and max over all y * x starts in (tile rows) * x steps.
    # Real layouts have a handful of tile rows; short layouts and files with
    # many more tile rows take each row on its own.
    ly = lay.y_coordinate_to_local_y_offset[:y].astype(np.int64)
    ids, group = np.unique(ty, return_inverse=True) if y > 16 else (ty, None)
    if 2 * len(ids) <= y:
        ly_min = np.full(len(ids), np.iinfo(np.int64).max)
        ly_max = np.full(len(ids), np.iinfo(np.int64).min)
        np.minimum.at(ly_min, group, ly)
        np.maximum.at(ly_max, group, ly)
    else:
        ids, ly_min, ly_max = ty, ly, None
    if budget is not None:
        # One unit (about a table decode) per 32 starts checked.  The Edge
        # TPU's tiles form a 4x4 grid (edgetpu-stack.md), so a real layout has
        # at most 16 tile ids and costs at most x / 2 units, while its
        # x-indexed vectors alone take 12 * x bytes of the package.
        budget.left -= 1 + len(ids) * x // 32
        if budget.left < 0:
            raise ExecutableError(f"checking the output layout ({len(ids)} tile rows x {x}) "
                                  f"exceeds the decoding budget of the {budget.nbytes}-byte "
                                  f"package", where=where)
    base = lay.linearized_tile_byte_offset.astype(np.int64)
    row = lay.x_coordinate_to_local_y_row_size[:x].astype(np.int64)
    xo = lay.x_coordinate_to_local_byte_offset[:x].astype(np.int64)
    step = max(1, (1 << 20) // x)
    for g0 in range(0, len(ids), step):
        g = slice(g0, g0 + step)
        at = base[ids[g, None] + tx[None, :]] + xo[None, :]
        lo = ly_min[g, None] * row[None, :]
        if ly_max is None:
            lo += at
            first, last = int(lo.min()), int(lo.max())
        else:
            hi = ly_max[g, None] * row[None, :]
            first = int((np.minimum(lo, hi) + at).min())
            last = int((np.maximum(lo, hi) + at).max())
        if first < 0 or last + z > limit:
            raise ExecutableError(f"output layout places elements outside the {limit}-element "
                                  f"output buffer", where=where)


def _kind(d: dict, is_output: bool, where: str, unknowns: Unknowns):
    """(``AnyLayer`` member name or UnknownEnum or "", its table or None)."""
    tag = d.get("any_layer_type", 0)
    if tag == 0:
        kind = ""
    else:
        kind = unknowns.name("AnyLayer", tag, where, "output layer kind" if is_output
                             else "input layer kind")
    body = d.get("any_layer")
    if is_output and not isinstance(kind, UnknownEnum) and (kind != "OutputLayer" or
                                                            body is None):
        raise ExecutableError("output layer carries no OutputLayer information", where=where)
    return kind, body


def layer_from_table(d: dict, is_output: bool, where: str,
                     budget: DecodeBudget | None = None,
                     unknowns: Unknowns | None = None) -> Layer:
    """A :class:`Layer` from a decoded ``Layer`` table, checked.

    The output layout check is charged to ``budget`` (the package's) when given.
    Unknown enum values are recorded in ``unknowns`` (a throwaway collector
    when None) and kept as numbers.
    """
    unknowns = Unknowns() if unknowns is None else unknowns
    name = d.get("name")
    where = f"{where} {name!r}"
    if not name:
        raise ExecutableError("layer has no name", where=where)
    data_type = unknowns.name("DataType", d.get("data_type", 0), where, "data type")
    # An unknown type has no known element size: the size checks use 1 byte
    # (the loosest), and loading refuses the layer.
    dtype, esize = _DTYPES.get(data_type, (None, 1))
    y, x, z = d.get("y_dim", 0), d.get("x_dim", 0), d.get("z_dim", 0)
    size, count = d.get("size_bytes", 0), d.get("execution_count_per_inference", 1)
    if min(y, x, z) < 1 or count < 1:
        raise ExecutableError(f"layer dimensions y={y} x={x} z={z} (execution count {count}) "
                              f"must all be >= 1", where=where)
    kind, body = _kind(d, is_output, where, unknowns)
    if size < y * x * z * esize:
        raise ExecutableError(f"size_bytes {size} is smaller than y*x*z*{esize} = "
                              f"{y * x * z * esize}", where=where)
    ranges = _ranges(d.get("shape"), where)
    shape = (y, x, z) if ranges is None else tuple(e - s + 1 for s, e in ranges)
    numerics = d.get("numerics") or {}
    raw_zp = numerics.get("zero_point", 0)
    layout = slices = padded_z = None
    if is_output and kind == "OutputLayer":
        out = body
        lay = out.get("layout")
        if lay is not None:
            layout = OutputLayout(**{f: lay.get(f, np.zeros(0, np.int32))
                                     for f in OutputLayout.__dataclass_fields__})
            _check_layout(layout, y, x, z, size * count // esize, where, budget)
            if x > 1 or y > 1:
                padded_z = layout.index(0, 1) - layout.index(0, 0) if x > 1 else \
                    layout.index(1, 0) - layout.index(0, 0)
        info = out.get("shape_info")
        if info is not None:
            layouts, offsets = info.get("slice_layout") or [], info.get("slice_offset")
            offsets = [] if offsets is None else offsets.tolist()
            if len(layouts) != len(offsets):
                raise ExecutableError(f"{len(layouts)} output slices but {len(offsets)} slice "
                                      f"offsets", where=where)
            slices = []
            for t, off in zip(layouts, offsets):
                r = _ranges(t.get("shape"), where) or ()
                stride = tuple(int(s) for s in (t.get("stride") if t.get("stride") is not None
                                                else ()))
                if len(stride) != len(r) or off < 0 or off % esize:
                    raise ExecutableError(f"output slice {len(slices)} has {len(r)} ranges, "
                                          f"{len(stride)} strides, offset {off}", where=where)
                slices.append(TensorSlice(r, stride, off))
            slices = tuple(slices)
    return Layer(
        name=name, shape=shape, dtype=dtype, zero_point=raw_zp - _SIGN_OFFSET.get(data_type, 0),
        scale=float(numerics.get("dequantization_factor", 0.0)), size_bytes=size,
        x_dim=x, y_dim=y, z_dim=z, padded_z=padded_z, data_type=data_type,
        raw_zero_point=raw_zp, execution_count=count,
        cache_on_dram=bool(d.get("cache_on_dram", False)), is_output=is_output,
        layout=layout, slices=slices, kind=kind)
