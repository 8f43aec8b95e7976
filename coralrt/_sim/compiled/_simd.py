"""The convolutions' inner product and requantization as explicit vector code
(numba intrinsics).

:func:`pair_dot_block` computes a block of ``ROWS`` x ``COLS`` int32 sums of
16-bit products, the way integer GEMMs do on CPUs: each step takes two
consecutive 16-bit values of a row, multiplies them with the matching two
weights of ``COLS`` columns and adds the products to each column's int32
sum.  It is written as LLVM vector operations, in one of two forms chosen by
the CPU the process runs on (:data:`PAIRED`):

* x86-64: the two values as one broadcast 32-bit lane, the weights of each
  column side by side; sign extension, multiplication, even/odd shuffle and
  addition, which LLVM turns into ``vpdpwssd`` (AVX-512 VNNI) or ``vpmaddwd``
  (AVX2).  4 rows x 32 columns.
* elsewhere (AArch64): each value broadcast on its own and multiplied with a
  vector of weights of one row, then accumulated, which LLVM turns into
  ``smlal``; 4 rows x 16 columns, so that the sums stay in registers.  The
  paired form compiles there too, but into three times as many instructions
  (checked by compiling both for Cortex-A72 with llvmlite; the speed on an
  ARM board has not been measured).

The sums are exact: inputs minus their zero point are at most 255 in
magnitude and weights fit int16, so each product stays far inside int32, and
the callers only come here when no partial sum can leave int32 (additions
wrap, as integers do, never saturate).

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
  the weights of rows 2k and 2k + 1 for its COLS columns (column by column
  when PAIRED, else row 2k's then row 2k + 1's), and the next step starts
  ``b_stride`` values later.
* ``acc``: int32, ROWS * COLS, written row after row.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["ROWS", "COLS", "LANES", "PAIRED", "pair_dot_block", "requant_lanes", "emit_block"]

#: x86-64 multiplies adjacent 16-bit pairs and adds them in one instruction
#: (``vpmaddwd``/``vpdpwssd``); other CPUs (AArch64's ``smlal``) multiply a
#: vector by one broadcast value and accumulate.  The weights' layout follows.
PAIRED = llvm.get_process_triple().split("-")[0] in ("x86_64", "amd64", "i386", "i686")

ROWS = 4                       # rows of the block (output pixels)
_LANES = 16                    # int32 sums per vector
LANES = _LANES                 # values requant_lanes takes at once
# Vectors per row: 2 on x86-64; 1 elsewhere, where 4 rows x 2 vectors of sums
# would take all 32 of AArch64's vector registers.
_VECTORS = 2 if PAIRED else 1
COLS = _LANES * _VECTORS       # columns of the block (output channels)

_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
_SUMS = ir.VectorType(_I32, _LANES)
_HALVES = ir.VectorType(_I16, _LANES)
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


def _load(builder, base, offset, vector_type):
    ptr = builder.gep(base, [offset])
    return builder.load(builder.bitcast(ptr, vector_type.as_pointer()), align=2)


def emit_block(builder, ap, a_off, a_stride, bp, b_off, b_stride, kp, cp, paired, vectors):
    """Emit the block loop at ``builder``: ``ap`` an i32 pointer (the rows' int16
    pairs), ``bp`` an i16 pointer (the weights), ``cp`` an i32 pointer (the
    sums, ROWS x 16 * vectors), the rest i64 values.  ``paired``: the weights of
    a step are (columns, 2), two weights per column side by side; otherwise
    (2, columns), the weights of row 2k then those of row 2k + 1."""
    i16p = _I16.as_pointer()
    entry = builder.block
    head = builder.append_basic_block("pairdot.head")
    body = builder.append_basic_block("pairdot.body")
    done = builder.append_basic_block("pairdot.done")
    builder.branch(head)

    builder.position_at_end(head)
    k = builder.phi(_I64)
    k.add_incoming(ir.Constant(_I64, 0), entry)
    sums = []
    for _ in range(ROWS * vectors):
        s = builder.phi(_SUMS)
        s.add_incoming(ir.Constant(_SUMS, [0] * _LANES), entry)
        sums.append(s)
    builder.cbranch(builder.icmp_signed("<", k, kp), body, done)

    builder.position_at_end(body)
    row_b = builder.add(b_off, builder.mul(k, b_stride))
    columns = _LANES * vectors
    if paired:
        weights = [_load(builder, bp, builder.add(row_b, ir.Constant(_I64, 2 * _LANES * j)),
                         _PAIRS) for j in range(vectors)]
    else:
        weights = [tuple(builder.sext(_load(builder, bp, builder.add(
                       row_b, ir.Constant(_I64, half * columns + _LANES * j)), _HALVES), _SUMS)
                         for half in (0, 1)) for j in range(vectors)]
    new = []
    for r in range(ROWS):
        at = builder.add(builder.add(a_off, builder.mul(ir.Constant(_I64, r), a_stride)), k)
        if paired:
            pair = builder.load(builder.gep(ap, [at]))                 # two int16 as one int32
            splat = builder.bitcast(_splat(builder, pair, _SUMS), _PAIRS)
            for j in range(vectors):
                new.append(builder.add(sums[r * vectors + j],
                                       _pair_products(builder, splat, weights[j])))
            continue
        first = builder.mul(at, ir.Constant(_I64, 2))
        a16 = builder.bitcast(ap, i16p)
        x0, x1 = (_splat(builder, builder.sext(builder.load(builder.gep(a16, [i])), _I32), _SUMS)
                  for i in (first, builder.add(first, ir.Constant(_I64, 1))))
        for j in range(vectors):
            w0, w1 = weights[j]
            new.append(builder.add(sums[r * vectors + j],
                                   builder.add(builder.mul(x0, w0), builder.mul(x1, w1))))
    k.add_incoming(builder.add(k, ir.Constant(_I64, 1)), body)
    for s, v in zip(sums, new):
        s.add_incoming(v, body)
    builder.branch(head)

    builder.position_at_end(done)
    for i, s in enumerate(sums):
        ptr = builder.gep(cp, [ir.Constant(_I64, i * _LANES)])
        builder.store(s, builder.bitcast(ptr, _SUMS.as_pointer()), align=4)


@intrinsic
def pair_dot_block(typingctx, a, a_off, a_stride, b, b_off, b_stride, kp, acc):
    sig = types.void(a, a_off, a_stride, b, b_off, b_stride, kp, acc)

    def codegen(context, builder, signature, args):
        aty, _, _, bty, _, _, _, accty = signature.args
        ap = context.make_array(aty)(context, builder, args[0]).data
        bp = context.make_array(bty)(context, builder, args[3]).data
        cp = context.make_array(accty)(context, builder, args[7]).data
        a_off, a_stride, b_off, b_stride, kp = (_as_i64(builder, args[i]) for i in (1, 2, 4, 5, 6))
        emit_block(builder, ap, a_off, a_stride, bp, b_off, b_stride, kp, cp, PAIRED, _VECTORS)
        return context.get_dummy_value()

    return sig, codegen


def _splat(builder, value, vector_type):
    """``value`` (an i32 or an i64) in every lane of a 16-lane ``vector_type``."""
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

