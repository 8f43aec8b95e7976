"""The convolutions' inner product and requantization as explicit vector code
(numba intrinsics).

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

:func:`requant_lanes` requantizes ``LANES`` consecutive sums at once, in the
same steps as ``_jit._requant`` (int64 product, ``(P + 2^30) >> 31``,
RoundingDivideByPOT, zero point, clamp).  Written as 16-lane vectors it runs
about a quarter faster than the loop LLVM vectorizes itself, which splits it
into 8-lane pieces.

The LLVM IR is built with llvmlite, numba's own code generator (installed
with it; coralrt[fast] needs nothing more).

numba's disk cache keys compiled code on the source of the module that holds
the jitted functions (``_jit.py``), not on this one: an installed package
replaces both files at once, but after editing this file in a checkout,
delete ``coralrt/_sim/compiled/__pycache__`` (or touch ``_jit.py``).

Operands of pair_dot_block, all C-contiguous:

* ``a``: int32 view of a (rows, 2 * kp) int16 matrix, flat; ``a_off`` the
  first row's offset and ``a_stride`` a row's length, in int32 units (kp).
* ``b``: flat int16 weights; from ``b_off`` on, step ``k`` of the block holds
  for each of its COLS columns the weights of rows 2k and 2k + 1, and the
  next step starts ``b_stride`` values later.
* ``acc``: int32, ROWS * COLS, written row after row.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["ROWS", "COLS", "LANES", "pair_dot_block", "requant_lanes"]

ROWS = 4                       # rows of the block (output pixels)
_LANES = 16                    # int32 sums per vector
LANES = _LANES                 # values requant_lanes takes at once
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


def _splat(builder, value, vector_type):
    v = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, _SPLAT)


@intrinsic
def requant_lanes(typingctx, acc, a_off, bias, m, rs, c_off, zp, lo, hi, out, o_off):
    """out[o_off + i] = requant(acc[a_off + i] + bias[c_off + i], m[c_off + i],
    rs[c_off + i]) for i < LANES: ``acc`` int32, or float32 holding integers
    (converted exactly); bias, m, rs int32; zp, lo, hi int32; ``out`` 8-bit."""
    sig = types.void(acc, a_off, bias, m, rs, c_off, zp, lo, hi, out, o_off)

    def codegen(context, builder, signature, args):
        kinds = signature.args
        wide = ir.VectorType(_I64, _LANES)

        def load(k, offset, element):
            base = context.make_array(kinds[k])(context, builder, args[k]).data
            ptr = builder.gep(base, [_as_i64(builder, offset)])
            return builder.load(builder.bitcast(ptr, ir.VectorType(element, _LANES).as_pointer()),
                                align=1)

        if isinstance(kinds[0].dtype, types.Float):
            v = builder.fptosi(load(0, args[1], ir.FloatType()), _SUMS)
        else:
            v = load(0, args[1], _I32)
        c_off = args[5]
        v = builder.add(v, load(2, c_off, _I32))
        m, rs = load(3, c_off, _I32), load(4, c_off, _I32)
        p = builder.add(builder.mul(builder.sext(v, wide), builder.sext(m, wide)),
                        _splat(builder, ir.Constant(_I64, 1 << 30), wide))
        q = builder.trunc(builder.ashr(p, _splat(builder, ir.Constant(_I64, 31), wide)), _SUMS)
        one = _splat(builder, ir.Constant(_I32, 1), _SUMS)
        mask = builder.sub(builder.shl(one, rs), one)
        negative = builder.icmp_signed("<", q, _splat(builder, ir.Constant(_I32, 0), _SUMS))
        threshold = builder.add(builder.ashr(mask, one), builder.zext(negative, _SUMS))
        up = builder.icmp_signed(">", builder.and_(q, mask), threshold)
        r = builder.add(builder.add(builder.ashr(q, rs), builder.zext(up, _SUMS)),
                        _splat(builder, args[6], _SUMS))
        lo, hi = _splat(builder, args[7], _SUMS), _splat(builder, args[8], _SUMS)
        r = builder.select(builder.icmp_signed("<", r, lo), lo, r)
        r = builder.select(builder.icmp_signed(">", r, hi), hi, r)
        element = context.get_data_type(kinds[9].dtype)
        base = context.make_array(kinds[9])(context, builder, args[9]).data
        ptr = builder.gep(base, [_as_i64(builder, args[10])])
        builder.store(builder.trunc(r, ir.VectorType(element, _LANES)),
                      builder.bitcast(ptr, ir.VectorType(element, _LANES).as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen

