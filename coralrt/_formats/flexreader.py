"""A bounds-checked, zero-copy reader of the FlexBuffer map in an
``edgetpu-custom-op``'s ``custom_options`` (the DWN1 package's wrapper).

Every value read costs one unit of a :class:`~coralrt._model.flatbuf.DecodeBudget`:
FlexBuffer vectors hold offsets, so many elements may name one inner vector.
"""

from __future__ import annotations

from dataclasses import dataclass

from coralrt.errors import ExecutableError
from coralrt._model.flatbuf import DecodeBudget

__all__ = ["FlexReader", "UnsupportedValue"]


_FX_NULL, _FX_INT, _FX_UINT, _FX_IND_INT, _FX_IND_UINT = 0, 1, 2, 6, 7
_FX_STRING, _FX_MAP, _FX_VECTOR, _FX_VECTOR_INT, _FX_VECTOR_UINT = 5, 9, 10, 11, 12
_FX_VECTOR_STRING, _FX_BLOB, _FX_BOOL = 15, 25, 26


class FlexReader:
    """A bounds-checked, zero-copy reader of the FlexBuffer map in ``custom_options``.

    Every value read costs one unit of ``budget`` (by default one for this
    buffer): FlexBuffer vectors hold offsets, so many elements may name the
    same inner vector.
    """

    def __init__(self, buf: memoryview, budget: DecodeBudget | None = None):
        self.buf, self.n = buf, len(buf)
        self.budget = DecodeBudget(self.n) if budget is None else budget

    def _fail(self, msg: str):
        raise ExecutableError(f"custom_options FlexBuffer: {msg}", where="custom_options")

    def _spend(self, units: int) -> None:
        budget = self.budget
        budget.left -= units
        if budget.left < 0:
            self._fail(f"reading it would take more than {budget.limit} steps, the most a "
                       f"{budget.nbytes}-byte buffer can need: its offsets name the same "
                       f"values over and over")

    def uint(self, pos: int, width: int, signed: bool = False) -> int:
        if width not in (1, 2, 4, 8) or pos < 0 or pos + width > self.n:
            self._fail(f"read of {width} bytes at {pos} is outside the {self.n}-byte buffer")
        return int.from_bytes(self.buf[pos:pos + width], "little", signed=signed)

    def indirect(self, pos: int, width: int) -> int:
        return pos - self.uint(pos, width)

    def sized(self, pos: int, width: int) -> memoryview:
        n = self.uint(pos - width, width)
        if pos + n > self.n:
            self._fail(f"a {n}-byte string at {pos} runs past the end of the buffer")
        return self.buf[pos:pos + n]

    def value(self, pos: int, width: int, packed: int, depth: int = 0):
        kind, w = packed >> 2, 1 << (packed & 3)
        if kind in (_FX_INT, _FX_UINT, _FX_BOOL):
            return self.uint(pos, width, kind == _FX_INT)
        if kind in (_FX_IND_INT, _FX_IND_UINT):
            return self.uint(self.indirect(pos, width), w, kind == _FX_IND_INT)
        if kind in (_FX_STRING, _FX_BLOB):
            return self.sized(self.indirect(pos, width), w)
        if kind == _FX_NULL:
            return None
        if kind in (_FX_VECTOR, _FX_VECTOR_INT, _FX_VECTOR_UINT, _FX_VECTOR_STRING) and depth < 2:
            vec = self.indirect(pos, width)
            n = self.uint(vec - w, w)
            if vec + n * w > self.n or (kind == _FX_VECTOR and vec + n * (w + 1) > self.n):
                self._fail(f"a {n}-element vector at {vec} runs past the end of the buffer")
            self._spend(1 + n)
            if kind == _FX_VECTOR:
                types = self.buf[vec + n * w:vec + n * (w + 1)]
                return [self.value(vec + i * w, w, types[i], depth + 1) for i in range(n)]
            if kind == _FX_VECTOR_STRING:
                return [self.sized(self.indirect(vec + i * w, w), w) for i in range(n)]
            return [self.uint(vec + i * w, w, kind == _FX_VECTOR_INT) for i in range(n)]
        return UnsupportedValue(kind)

    def root_map(self) -> dict:
        if self.n < 3:
            self._fail(f"{self.n} bytes is too short")
        root_width, packed = self.buf[-1], self.buf[-2]
        if packed >> 2 != _FX_MAP:
            self._fail(f"the root is FlexBuffer type {packed >> 2}, not a map")
        w = 1 << (packed & 3)
        m = self.indirect(self.n - 2 - root_width, root_width)
        size = self.uint(m - w, w)
        keys, key_w = self.indirect(m - 3 * w, w), self.uint(m - 2 * w, w)
        types = m + size * w
        if types + size > self.n or keys + size * key_w > self.n:
            self._fail(f"a {size}-entry map at {m} runs past the end of the buffer")
        self._spend(1 + size)
        out = {}
        for i in range(size):
            k = self.indirect(keys + i * key_w, key_w)
            end = bytes(self.buf[max(k, 0):k + 64]).find(b"\0") if k >= 0 else -1
            if end < 0:
                self._fail(f"map key {i} is not a terminated string")
            key = bytes(self.buf[k:k + end]).decode("ascii", "replace")
            out[key] = self.value(m + i * w, w, self.buf[types + i])
        return out


@dataclass(frozen=True)
class UnsupportedValue:
    """A FlexBuffer value of a type the custom op never uses (kept, not decoded)."""

    flex_type: int
