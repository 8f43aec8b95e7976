"""CRC-32 arithmetic: the CRC of a concatenation from the CRCs of its parts.

zlib's ``crc32_combine`` is not exposed by Python's ``zlib``; this is the same
computation (polynomial arithmetic modulo the bit-reflected CRC-32 polynomial,
as zlib's crc32.c does it), for checking claimed CRCs of pieces of a buffer
against a CRC of the whole that was already verified, without reading the
pieces again.
"""

from __future__ import annotations

import functools

__all__ = ["crc32_combine"]

_POLY = 0xEDB88320                         # CRC-32, reflected (zlib)


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (bit-reflected, as zlib's crc32.c)."""
    m, p = 1 << 31, 0
    while m:
        if a & m:
            p ^= b
            if not a & (m - 1):
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


@functools.lru_cache(maxsize=1)
def _x2n_table() -> tuple[int, ...]:
    table = [1 << 30]  # x^1; then x^(2^n)
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return tuple(table)


@functools.lru_cache(maxsize=256)
def _x8n(n: int) -> int:
    """x^(8n) modulo the polynomial: what appending n bytes multiplies a CRC by."""
    table, p, k = _x2n_table(), 1 << 31, 3
    while n:
        if n & 1:
            p = _multmodp(table[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A + B from crc32(A), crc32(B) and len(B) (zlib's crc32_combine)."""
    return _multmodp(_x8n(len2), crc1) ^ crc2
