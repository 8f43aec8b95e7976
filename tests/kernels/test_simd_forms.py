"""Both forms of the compiled convolutions' vector block (coralrt/_sim/compiled/_simd.py).

A process only ever compiles the form of its own CPU (x86-64: adjacent pairs
of products; elsewhere: one broadcast value times a vector).  Here each form
is emitted into a plain LLVM module, compiled for this machine with
llvmlite's JIT and run on random int16 rows and weights, against an int64
matrix product: the form an ARM board runs is checked on x86-64 too.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("numba", reason="the vector blocks are part of the fast extra (numba)")
llvm = pytest.importorskip("llvmlite.binding")
from llvmlite import ir  # noqa: E402

from coralrt._sim.compiled import _simd  # noqa: E402


def _compiled_block(paired: bool, vectors: int):
    """block(a, b, kp, c) for ROWS rows and 16 * vectors columns, as a ctypes function."""
    i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
    module = ir.Module(name="block")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i32.as_pointer(), i16.as_pointer(),
                                                             i64, i32.as_pointer()]), "block")
    a, b, kp, c = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    step = ir.Constant(i64, 2 * 16 * vectors)
    _simd.emit_block(builder, a, ir.Constant(i64, 0), kp, b, ir.Constant(i64, 0), step, kp, c,
                     paired, vectors)
    builder.ret_void()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple().create_target_machine(opt=2)
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    engine = llvm.create_mcjit_compiler(parsed, target)
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                             ctypes.c_void_p)
    return engine, proto(engine.get_function_address("block"))


@pytest.mark.parametrize("kp", [1, 7, 32])
@pytest.mark.parametrize("vectors", [1, 2])
@pytest.mark.parametrize("paired", [True, False])
def test_both_forms_sum_int16_products_exactly(paired, vectors, kp):
    rng = np.random.default_rng(kp * 4 + vectors * 2 + paired)
    cols = 16 * vectors
    x = rng.integers(-255, 256, (_simd.ROWS, 2 * kp)).astype(np.int16)      # inputs - zero point
    w = rng.integers(-32767, 32768, (2 * kp, cols)).astype(np.int16)        # weights, int16
    steps = w.reshape(kp, 2, cols)
    packed = np.ascontiguousarray(steps.transpose(0, 2, 1) if paired else steps).reshape(-1)
    out = np.full(_simd.ROWS * cols, 12345, np.int32)
    engine, block = _compiled_block(paired, vectors)
    block(x.view(np.int32).ctypes.data, packed.ctypes.data, kp, out.ctypes.data)
    want = x.astype(np.int64) @ w.astype(np.int64)                          # |sums| < 2^31
    np.testing.assert_array_equal(out.reshape(_simd.ROWS, cols), want)
    del engine


def test_this_machine_uses_the_form_of_its_cpu():
    machine = llvm.get_process_triple().split("-")[0]
    assert _simd.PAIRED == (machine in ("x86_64", "amd64", "i386", "i686"))
    assert _simd.COLS == (32 if _simd.PAIRED else 16)
