"""The convolutions' inner product as explicit vector code (a numba intrinsic).

:func:`pair_dot_block` computes a block of ``ROWS`` x ``COLS`` int32 sums of
16-bit products, the way integer GEMMs do on CPUs: each step takes two
consecutive 16-bit values of a row (one 32-bit load, broadcast to all lanes),
multiplies them with the matching two weights of ``COLS`` columns, and adds
each pair of products to that column's int32 sum.  It is written as LLVM
vector operations (sign extension, multiplication, even/odd lane shuffle,
addition), which LLVM turns into ``vpmaddwd`` or ``vpdpwssd`` on x86-64 and
into widening multiply-adds elsewhere.  The sums are exact: each product is
below 2^16 in magnitude, and the callers only come here when no partial sum
can leave int32 (additions wrap, as integers do, never saturate).

Operands, all C-contiguous:

* ``a``: int32 view of a (rows, 2 * kp) int16 matrix, flat; ``a_off`` the
  first row's offset and ``a_stride`` a row's length, in int32 units (kp).
* ``b``: flat int16 weights packed as (kp, n_pad, 2): for step ``k`` and
  column ``c``, the weights of rows 2k and 2k + 1; ``b_off`` the block's first
  column times 2, ``b_stride`` n_pad * 2.
* ``acc``: int32, ROWS * COLS, written row after row.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["ROWS", "COLS", "pair_dot_block"]

ROWS = 4                       # rows of the block (output pixels)
_LANES = 16                    # int32 sums per vector
_VECTORS = 2                   # vectors per row
COLS = _LANES * _VECTORS       # columns of the block (output channels)

_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
_SUMS = ir.VectorType(_I32, _LANES)
_PAIRS = ir.VectorType(_I16, 2 * _LANES)
_WIDE = ir.VectorType(_I32, 2 * _LANES)
_EVEN = ir.Constant(ir.VectorType(_I32, _LANES), [2 * i for i in range(_LANES)])
_ODD = ir.Constant(ir.VectorType(_I32, _LANES), [2 * i + 1 for i in range(_LANES)])
_SPLAT = ir.Constant(ir.VectorType(_I32, _LANES), [0] * _LANES)


def _pair_products(builder, a, b):
    """(2n x i16, 2n x i16) -> n x i32: a[2i] * b[2i] + a[2i + 1] * b[2i + 1]."""
    p = builder.mul(builder.sext(a, _WIDE), builder.sext(b, _WIDE))
    return builder.add(builder.shuffle_vector(p, p, _EVEN), builder.shuffle_vector(p, p, _ODD))


def _as_i64(builder, v):
    return v if v.type == _I64 else builder.sext(v, _I64)


@intrinsic
def pair_dot_block(typingctx, a, a_off, a_stride, b, b_off, b_stride, kp, acc):
    sig = types.void(a, a_off, a_stride, b, b_off, b_stride, kp, acc)

    def codegen(context, builder, signature, args):
        aty, _, _, bty, _, _, _, accty = signature.args
        ap = context.make_array(aty)(context, builder, args[0]).data
        bp = context.make_array(bty)(context, builder, args[3]).data
        cp = context.make_array(accty)(context, builder, args[7]).data
        a_off, a_stride, b_off, b_stride, kp = (_as_i64(builder, args[i]) for i in (1, 2, 4, 5, 6))
        zero = ir.Constant(_SUMS, [0] * _LANES)

        entry = builder.block
        head = builder.append_basic_block("pairdot.head")
        body = builder.append_basic_block("pairdot.body")
        done = builder.append_basic_block("pairdot.done")
        builder.branch(head)

        builder.position_at_end(head)
        k = builder.phi(_I64)
        k.add_incoming(ir.Constant(_I64, 0), entry)
        sums = []
        for _ in range(ROWS * _VECTORS):
            s = builder.phi(_SUMS)
            s.add_incoming(zero, entry)
            sums.append(s)
        builder.cbranch(builder.icmp_signed("<", k, kp), body, done)

        builder.position_at_end(body)
        row_b = builder.add(b_off, builder.mul(k, b_stride))
        weights = []
        for j in range(_VECTORS):
            ptr = builder.gep(bp, [builder.add(row_b, ir.Constant(_I64, 2 * _LANES * j))])
            weights.append(builder.load(builder.bitcast(ptr, _PAIRS.as_pointer()), align=2))
        new = []
        for r in range(ROWS):
            at = builder.add(builder.add(a_off, builder.mul(ir.Constant(_I64, r), a_stride)), k)
            pair = builder.load(builder.gep(ap, [at]))                 # two int16 as one int32
            splat = builder.insert_element(ir.Constant(_SUMS, ir.Undefined), pair,
                                           ir.Constant(_I32, 0))
            splat = builder.bitcast(builder.shuffle_vector(splat, splat, _SPLAT), _PAIRS)
            for j in range(_VECTORS):
                new.append(builder.add(sums[r * _VECTORS + j],
                                       _pair_products(builder, splat, weights[j])))
        k.add_incoming(builder.add(k, ir.Constant(_I64, 1)), body)
        for s, v in zip(sums, new):
            s.add_incoming(v, body)
        builder.branch(head)

        builder.position_at_end(done)
        for i, s in enumerate(sums):
            ptr = builder.gep(cp, [ir.Constant(_I64, i * _LANES)])
            builder.store(s, builder.bitcast(ptr, _SUMS.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen
