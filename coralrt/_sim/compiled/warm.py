"""Compile every loop of :mod:`coralrt._sim.compiled._jit` for the argument types the
kernels pass (uint8 and int8 data), on tiny arrays, so that a broken numba is
found before any model runs and the compile cost is paid (or loaded from the
disk cache) once, up front."""

from __future__ import annotations

import numpy as np

__all__ = ["warm_up"]


def warm_up(jit) -> None:
    i64 = np.zeros(2, np.int64)
    for dt in (np.uint8, np.int8):
        x = np.zeros((1, 2, 2, 2), dt)
        out = np.empty((1, 2, 2, 2), dt)
        bias = np.zeros(2, np.int32)
        jit.conv_2d(x, np.zeros((1, 1, 2, 2), np.int32), bias, 0, 1, 1, 1, 1, 0, 0,
                    i64 + (1 << 30), i64, i64, 0, -128, 127, out)
        jit.depthwise_conv_2d(x, np.zeros((1, 1, 2), np.int32), bias, 0, 1, 1, 1, 1, 1, 0, 0,
                              i64 + (1 << 30), i64, i64, 0, -128, 127, out)
        jit.fully_connected(np.zeros((1, 2), dt), np.zeros((2, 2), np.int32), i64, 0,
                            np.ones(2), 0, -128, 127, np.empty((1, 2), dt))
        a = np.zeros((2, 2), np.float32)
        jit.to_float32(np.zeros((2, 2), dt), 0, a)
        jit.requant_rows(a, np.zeros(2, np.int64), i64 + (1 << 30), i64, i64, 0, -128, 127,
                         np.empty((2, 2), dt))
