"""The simulator's thread pool, BLAS limit and reused temporaries
(coralrt/_ops/arith/parallel.py, coralrt/_ops/arith/scratch.py): bands cover their range once,
failures propagate, results never alias a reused buffer, and the answers are
the same on one thread or several."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import shared_model

from coralrt import InferenceSession
from coralrt.errors import ConfigError
from coralrt._formats.segment import build_segment
from coralrt import load_model
from coralrt.testing import ModelBuilder
from coralrt._ops.arith import parallel
from coralrt._ops.arith.scratch import TEMPORARIES, Arena
from coralrt._sim.runner import SegmentRunner


def test_threads_setting(monkeypatch):
    monkeypatch.delenv("CORALRT_SIM_THREADS", raising=False)
    assert parallel.threads() == 1                       # the measured default
    monkeypatch.setenv("CORALRT_SIM_THREADS", "3")
    assert parallel.threads() == 3
    monkeypatch.setenv("CORALRT_SIM_THREADS", "auto")
    assert 1 <= parallel.threads() <= 8
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("CORALRT_SIM_THREADS", bad)
        with pytest.raises(ConfigError, match="CORALRT_SIM_THREADS"):
            parallel.threads()


@pytest.mark.parametrize("n", ["1", "2", "4"])
def test_bands_cover_the_range_once(monkeypatch, n):
    monkeypatch.setenv("CORALRT_SIM_THREADS", n)
    seen, lock, names = [], threading.Lock(), set()

    def fn(start, stop):
        with lock:
            seen.append((start, stop))
            names.add(threading.current_thread().name)
        # A nested call runs on the same thread, in order.
        inner = []
        parallel.for_bands(3, 1, lambda a, b: inner.append((a, b, threading.get_ident())))
        assert [x[:2] for x in inner] == [(0, 1), (1, 2), (2, 3)]
        assert {x[2] for x in inner} == {threading.get_ident()}

    parallel.for_bands(103, 10, fn)
    assert sorted(seen) == [(s, min(s + 10, 103)) for s in range(0, 103, 10)]
    assert len(names) <= int(n)
    parallel.for_bands(0, 10, fn)                       # nothing to do
    assert len(seen) == 11


def test_a_failing_band_fails_the_call_after_every_band_stopped(monkeypatch):
    monkeypatch.setenv("CORALRT_SIM_THREADS", "2")
    running, done = threading.Event(), []

    def fn(start, stop):
        if start == 0:
            raise ValueError("band 0")
        running.set()
        done.append(start)

    with pytest.raises(ValueError, match="band 0"):
        parallel.for_bands(50, 1, fn)
    count = len(done)
    assert count < 49                                     # the others stopped early
    threading.Event().wait(0.05)
    assert len(done) == count                             # and none runs afterwards


def test_blas_limit_nests_and_restores():
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]
    before = blas_threads()
    with parallel.blas_single_threaded():
        assert all(n == 1 for n in blas_threads())
        with parallel.blas_single_threaded():
            assert all(n == 1 for n in blas_threads())
        assert all(n == 1 for n in blas_threads())
    assert blas_threads() == before


def test_arena_buffers_are_per_thread_and_grow():
    arena = Arena()
    a = arena.array("x", (4, 5), np.float32)
    assert a.flags.c_contiguous and a.ctypes.data % 64 == 0
    b = arena.array("x", (2, 3), np.float64)              # smaller: same memory
    assert np.shares_memory(a, b) and arena.owns(b[1:]) and not arena.owns(np.zeros(3))
    c = arena.array("x", (100, 100), np.float64)          # larger: a new buffer
    assert not np.shares_memory(a, c) and arena.owns(c)
    other = []
    t = threading.Thread(target=lambda: other.append(arena.array("x", (4, 5), np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], c) and not arena.owns(other[0])
    arena.release()
    assert not arena.owns(c)


def test_a_kernel_result_in_a_temporary_is_copied(monkeypatch):
    """The runner's guard: a result living in a reused buffer never reaches a reader."""
    from coralrt._sim import kernels

    def leaky(ctx):
        def run(inputs):
            out = TEMPORARIES.array("leak", inputs[0].shape, inputs[0].dtype)
            out[...] = inputs[0]
            return [out]
        return run
    kernels.kernel_for("RELU")                              # the registry loaded first
    monkeypatch.setitem(kernels.KERNELS, "RELU", leaky)
    b = ModelBuilder()
    x_t = b.input("x", (1, 4, 4, 1), np.uint8, scale=0.1, zero_point=0)
    y_t = b.tensor("y", (1, 4, 4, 1), np.uint8, scale=0.1, zero_point=0)
    b.op("RELU", [x_t], [y_t])
    b.output(y_t)
    runner = SegmentRunner(build_segment(load_model(b.build().to_bytes())))
    x = np.arange(16, dtype=np.uint8).reshape(1, 4, 4, 1)
    first = runner.run([x])[0]
    runner.run([x[::-1].copy()])
    assert np.array_equal(first, x) and not TEMPORARIES.owns(first)


@pytest.fixture(scope="module")
def mobilenet():
    return shared_model("mobilenet_v2_1.0_224_quant.tflite")


def test_threads_give_the_same_answers_and_outputs_are_not_reused(monkeypatch, mobilenet):
    """Two threads bit for bit like one; an output stays what it was after later runs
    (outputs never alias a reused buffer, so overlapping requests are safe)."""
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (1, 224, 224, 3), dtype=np.uint8) for _ in range(2)]
    monkeypatch.setenv("CORALRT_SIM_THREADS", "1")
    one = InferenceSession(mobilenet, target="sim")
    want = [one.run(im) for im in images]
    monkeypatch.setenv("CORALRT_SIM_THREADS", "2")
    two = InferenceSession(mobilenet, target="sim")
    got = [two.run(im) for im in images]
    for w, g in zip(want, got):
        assert w.keys() == g.keys()
        for k in w:
            assert np.array_equal(w[k], g[k])
    kept = {k: v.copy() for k, v in got[0].items()}
    futures = [two.submit(im) for im in images * 2]        # overlapping requests
    results = [f.result(timeout=60) for f in futures]
    for k in kept:
        assert np.array_equal(got[0][k], kept[k])
        assert np.array_equal(results[0][k], want[0][k])
        assert np.array_equal(results[3][k], want[1][k])


_BROKEN_BLAS = """
from coralrt._ops.arith import parallel

class Broken:
    def limit(self, **kwargs):
        raise RuntimeError("no BLAS found")

parallel._blas["controller"] = Broken()
with parallel.blas_single_threaded():
    assert parallel._blas["limit"] is None, parallel._blas
parallel._blas["controller"] = False             # threadpoolctl not installed
with parallel.blas_single_threaded():
    assert parallel._blas["limit"] is None, parallel._blas
print("ok")
"""


def test_a_failing_blas_limit_does_not_fail_an_inference():
    """threadpoolctl missing or failing: the simulator runs on, BLAS unlimited.

    In a fresh interpreter: the limit is process-wide and only an entry that
    finds no other thread inside takes a new one, and in this process worker
    threads of earlier tests' sessions may still be inside it."""
    out = subprocess.run([sys.executable, "-c", _BROKEN_BLAS], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
