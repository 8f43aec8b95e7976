"""Compile every loop of :mod:`coralrt._sim.compiled._jit` for the argument types the
kernels pass (uint8 and int8 data), on tiny arrays, so that a broken numba is
found before any model runs and the compile cost is paid (or loaded from the
disk cache) once, up front."""

from __future__ import annotations

import numpy as np

__all__ = ["warm_up"]


def warm_up(jit) -> None:
    i32 = np.int32
    m, rs, bias = np.full(2, 1 << 30, i32), np.zeros(2, i32), np.zeros(2, i32)
    q = (m, rs, i32(0), i32(-128), i32(127))
    for dt in (np.uint8, np.int8):
        x = np.zeros((1, 2, 2, 2), dt)
        out = np.empty((1, 2, 2, 2), dt)
        jit.depthwise_conv_2d(x, np.zeros((1, 1, 2), i32), bias, i32(0), 1, 1, 1, 1, 1, 0, 0,
                              *q, out)
        f = np.zeros(2, np.float32)
        jit.depthwise_3x3(x, np.zeros((9, 2), np.float32), f, f, i32(0), 1, 1, 1, 1, 1, 1, *q,
                          out)
        a = np.zeros((4, 2), np.int16)
        jit.rows_int16(np.zeros((2, 2), dt), i32(0), a)
        jit.im2col_int16(x, 0, 0, 1, 2, 1, 1, 1, 1, 1, 1, 0, 0, i32(0), a)
        jit.gemm_requant(a.view(i32), 2, np.zeros(2 * jit.COLS, np.int16), 2, jit.COLS, bias, *q,
                         np.empty(4, dt))
        jit.fully_connected(np.zeros((1, 2), dt), np.zeros((2, 2), i32), np.zeros(2, np.int64),
                            0, np.ones(2), 0, -128, 127, np.empty((1, 2), dt))
        jit.pair_table(np.zeros(2, dt).view(np.uint8), np.zeros(2, dt).view(np.uint8),
                       np.zeros(1 << 16, dt), np.empty(2, dt))
        e = np.ones(256, np.int64)
        for out_dt in (dt, np.int16):
            info = np.iinfo(out_dt)
            jit.softmax_rows(np.zeros((1, 2), dt), e, e, info.bits, int(info.min), int(info.max),
                             np.empty((1, 2), out_dt))
