"""Host-side data transforms around an Edge TPU executable (reference §2.6).

* Inputs: the tensor's bytes in C order, the top byte of every signed 8- or
  16-bit element XORed with 0x80 (the TPU works in offset binary), zero
  padding up to the layer's padded size and to the end of the furthest input
  DMA hint.
* Outputs: relayout from the device's tiled order (``OutputLayout``) or from
  several shape slices into Y×X×Z order, the same signed XOR, and clamping to
  0..255 for 16-bit or float "classifier" outputs that the model gives as uint8.

Everything is vectorised with numpy; index arrays for a relayout are built
once per layer and reused.  :class:`InputStager` and :class:`OutputDecoder`
hold those per-layer buffers so a warm inference allocates little.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ExecutableError, InputError

__all__ = ["xor_sign", "InputStager", "OutputDecoder", "relayout_index", "clamp_classifier",
           "element_size"]

_SIZES = {"FIXED_POINT8": 1, "SIGNED_FIXED_POINT8": 1, "FIXED_POINT16": 2,
          "SIGNED_FIXED_POINT16": 2, "SIGNED_FIXED_POINT32": 4, "BFLOAT": 2, "HALF": 2,
          "SINGLE": 4}
_DEVICE_DTYPES = {"FIXED_POINT8": np.uint8, "SIGNED_FIXED_POINT8": np.int8,
                  "FIXED_POINT16": np.uint16, "SIGNED_FIXED_POINT16": np.int16,
                  "SIGNED_FIXED_POINT32": np.int32, "BFLOAT": np.uint16,
                  "HALF": np.float16, "SINGLE": np.float32}


def element_size(data_type: str) -> int:
    return _SIZES[data_type]


def xor_sign(raw: np.ndarray, data_type: str) -> None:
    """In place on uint8 bytes: flip the top bit of each signed 8/16-bit element."""
    if data_type == "SIGNED_FIXED_POINT8":
        np.bitwise_xor(raw, 0x80, out=raw)
    elif data_type == "SIGNED_FIXED_POINT16":
        top = raw[1::2]               # little-endian: the odd bytes are the top bytes
        np.bitwise_xor(top, 0x80, out=top)


class InputStager:
    """Turns an input array into the bytes the device reads, in a reused buffer.

    ``size`` is the padded buffer size: the layer's padded size, or more when
    an input DMA hint reads past it (libedgetpu's ``allow_overflow``).  Bytes
    past the data stay zero.
    """

    def __init__(self, layer, size: int | None = None):
        self.layer = layer
        self.data_type = layer.data_type
        self.nbytes = int(np.prod(layer.shape, dtype=np.int64)) * element_size(layer.data_type) \
            * getattr(layer, "execution_count", 1)
        self.size = max(int(size or 0), self.nbytes, int(layer.size_bytes))
        self.buffer = np.zeros(self.size, np.uint8)
        self.signed = self.data_type in ("SIGNED_FIXED_POINT8", "SIGNED_FIXED_POINT16")

    def stage(self, value) -> np.ndarray:
        """Copy ``value`` in (converted to the layer's dtype if needed); the whole buffer."""
        arr = np.asarray(value)
        raw = arr.reshape(-1).view(np.uint8) if arr.flags.c_contiguous else \
            np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        if raw.size != self.nbytes:
            raise InputError(f"input {self.layer.name!r} has {raw.size} bytes "
                             f"({arr.dtype}{list(arr.shape)}); the executable expects "
                             f"{self.nbytes} ({self.layer.dtype}{list(self.layer.shape)})")
        head = self.buffer[:self.nbytes]
        head[...] = raw
        if self.signed:
            xor_sign(head, self.data_type)
        return self.buffer


def relayout_index(layer) -> np.ndarray | None:
    """Byte positions in the raw output of each byte of the Y×X×Z result (C order),
    or None when the raw output is already in that order."""
    es = element_size(layer.data_type)
    count = getattr(layer, "execution_count", 1)
    layout, slices = getattr(layer, "layout", None), getattr(layer, "slices", None)
    if slices and len(slices) == 1 and slices[0].packed:
        return None
    if slices:
        idx = _slices_index(layer, slices)
    elif layout is not None:
        starts = layout.row_starts(slice(0, layer.y_dim), slice(0, layer.x_dim))  # elements
        elements = starts[:, :, None] + np.arange(layer.z_dim, dtype=np.int64)[None, None, :]
        idx = elements.reshape(-1)
    else:
        return None
    # element index -> byte index of every byte of every element
    idx = (idx[:, None] * es + np.arange(es, dtype=np.int64)[None, :]).reshape(-1)
    if count > 1:
        idx = (idx[None, :] + (np.arange(count, dtype=np.int64) * layer.size_bytes)[:, None]
               ).reshape(-1)
    return idx.astype(np.intp)


def _slices_index(layer, slices) -> np.ndarray:
    """Element positions for output shape slices: each slice covers ``ranges`` of the
    full shape (inclusive), stored at byte ``offset`` with element ``stride`` per dim."""
    shape = tuple(layer.shape)
    es = element_size(layer.data_type)
    out = np.full(int(np.prod(shape, dtype=np.int64)), -1, np.int64)
    full = np.arange(out.size, dtype=np.int64).reshape(shape)
    for s in slices:
        rng = list(s.ranges)[-len(shape):]
        sel = tuple(slice(a, b + 1) for a, b in rng)
        local = np.zeros([b - a + 1 for a, b in rng], np.int64)
        for d, st in enumerate(list(s.stride)[-len(shape):]):
            extent = rng[d][1] - rng[d][0] + 1
            view = [1] * len(shape)
            view[d] = extent
            local = local + (np.arange(extent, dtype=np.int64) * st).reshape(view)
        out[full[sel].reshape(-1)] = (s.offset // es + local).reshape(-1)
    if (out < 0).any():
        raise ExecutableError(f"output {layer.name!r}: its shape slices do not cover the tensor")
    return out


def clamp_classifier(values: np.ndarray, layer, want: np.dtype) -> np.ndarray:
    """16-bit or float classifier output given to the model as uint8 (reference §2.6)."""
    if layer.data_type == "SINGLE":
        scale = layer.scale or 1.0
        values = np.round(values.astype(np.float64) / scale + layer.zero_point)
    return np.clip(values, 0, 255).astype(want)


class OutputDecoder:
    """Raw device bytes of one output layer -> the host array."""

    def __init__(self, layer, want_dtype=None):
        self.layer = layer
        self.index = relayout_index(layer)
        self.device_dtype = np.dtype(_DEVICE_DTYPES[layer.data_type]).newbyteorder("<")
        count = getattr(layer, "execution_count", 1)
        self.shape = tuple(layer.shape) if count == 1 else (count, *layer.shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.device_dtype.itemsize
        self.want = np.dtype(want_dtype) if want_dtype is not None else None
        self.signed = layer.data_type in ("SIGNED_FIXED_POINT8", "SIGNED_FIXED_POINT16")

    def decode(self, raw: np.ndarray) -> np.ndarray:
        """``raw``: uint8 bytes as received (at least the layer's padded size)."""
        data = raw[self.index] if self.index is not None else raw[:self.nbytes].copy()
        if self.signed:
            xor_sign(data, self.layer.data_type)
        values = data.view(self.device_dtype).reshape(self.shape)
        if self.want is not None and self.want == np.uint8 and self.device_dtype.itemsize > 1:
            return clamp_classifier(values, self.layer, self.want)
        if self.want is not None and self.want != values.dtype and \
                self.want.itemsize == values.dtype.itemsize:
            return values.view(self.want)
        return values
