"""``InferenceSession.close`` racing requests: a request in progress when the
session closes returns its outputs (the right ones), and one that could not
run raises SessionClosedError; nothing else ever reaches the caller (not a
device error from a stick closed under the request, not ``None``).

The stress tests run requests from several threads (``run`` in the caller's
thread, ``run(timeout=...)`` and ``submit`` through the session's queue) on
simulated sticks, close the session with ``cancel=True`` at varying moments
and repeat; the others hold a request at a known point with a plugin kernel.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import numpy as np
import pytest
from support.models import conv_chain

import coralrt
from coralrt import InferenceSession
from coralrt._compile.cache import CompileCache
from coralrt.errors import SessionClosedError
from coralrt.testing import ModelBuilder, open_simulated_sticks

NO_CACHE = CompileCache(enabled=False)
TIMEOUT = 30.0          # per request / join: generous, never reached when things work
BUDGET = 25.0           # seconds of repetitions per stress test (at least MIN_ROUNDS)
ROUNDS, MIN_ROUNDS = 12, 4


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))


def frame(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (1, 64, 64, 32), dtype=np.uint8)


# -- stress: threads running while another thread closes with cancel=True --------------------

def _hammer(session, x, reference, how: str, outcomes: list, stop: threading.Event) -> None:
    """Run ``x`` until the session refuses; record what each request ended with."""
    while not stop.is_set():
        try:
            if how == "run":
                out = session.run(x)
            elif how == "run-timeout":
                out = session.run(x, timeout=TIMEOUT)
            else:
                out = session.submit(x).result(TIMEOUT)
        except SessionClosedError:
            outcomes.append("closed")
            return
        except concurrent.futures.CancelledError:
            # close(cancel=True) cancels a submitted future that had not started (documented)
            outcomes.append("cancelled" if how == "submit" else "cancelled outside submit")
            return
        except BaseException as e:  # noqa: BLE001 - what the test looks for
            outcomes.append(f"{how}: {type(e).__name__}: {e}")
            return
        if not isinstance(out, dict) or list(out) != list(reference) or not all(
                np.array_equal(out[k], reference[k]) for k in reference):
            outcomes.append(f"{how}: wrong result {type(out).__name__}")
            return
        outcomes.append("ok")


def _stress(open_session, x, reference) -> dict:
    outcomes: list[str] = []
    start = time.monotonic()
    rounds = 0
    while rounds < ROUNDS and (rounds < MIN_ROUNDS or time.monotonic() - start < BUDGET):
        session = open_session()
        stop = threading.Event()
        threads = [threading.Thread(target=_hammer, daemon=True,
                                    args=(session, x, reference, how, outcomes, stop))
                   for how in ("run", "run", "run-timeout", "run-timeout", "submit", "submit")]
        for t in threads:
            t.start()
        time.sleep(0.01 * (rounds % 6))          # close at varying moments
        session.close(cancel=True)
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        assert not any(t.is_alive() for t in threads), "a request never returned after close"
        rounds += 1
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o] = counts.get(o, 0) + 1
    return counts


def _check(counts: dict) -> None:
    bad = {k: n for k, n in counts.items() if k not in ("ok", "closed", "cancelled")}
    assert not bad, f"requests racing close(cancel=True) ended otherwise: {bad} (all: {counts})"
    assert counts.get("closed", 0) > 0


def test_close_cancel_racing_runs_on_a_single_stick_sim_session():
    model, x = conv_chain(1), frame()
    with InferenceSession(model, target="sim", cache=NO_CACHE) as s:
        assert [r["kind"] for r in s.profile()] == ["tpu"]
        reference = s.run(x)
    _check(_stress(lambda: InferenceSession(model, target="sim", cache=NO_CACHE), x, reference))


@pytest.mark.parametrize("strategy,segments", [("replicate", 1), ("pipeline", 2)])
def test_close_cancel_racing_runs_on_a_multi_stick_sim_session(strategy, segments):
    model, x = conv_chain(segments), frame()
    with InferenceSession(model, target="sim", cache=NO_CACHE) as s:
        assert sum(r["kind"] == "tpu" for r in s.profile()) == segments
        reference = s.run(x)
    sticks = open_simulated_sticks(2)
    try:
        counts = _stress(lambda: InferenceSession(model, target="sim", cache=NO_CACHE,
                                                  device=sticks, strategy=strategy), x, reference)
    finally:
        for stick in sticks:
            stick.close()
    _check(counts)


# -- a request held at a known point --------------------------------------------------------

class Hold:
    """Plugin kernel "Hold": identity on uint8, once ``release`` is set; ``action``
    (if any) runs inside the kernel first."""

    def __init__(self, action=None):
        self.release = threading.Event()
        self.entered = threading.Event()
        self.action = action

    def kernel(self, inputs, op):
        self.entered.set()
        if self.action is not None:
            self.action()
        assert self.release.wait(TIMEOUT)
        return [inputs[0].copy()]

    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        registry.add_kernel("Hold", self.kernel)


def held_then_tpu_model():
    """x -> Hold (a CPU plugin step) -> 1x1 CONV_2D (an Edge TPU step) -> y."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 64, 64, 32), np.uint8, scale=0.02, zero_point=128)
    h = b.tensor("h", (1, 64, 64, 32), np.uint8, scale=0.02, zero_point=128)
    b.op("Hold", [x], [h])
    w = b.constant("w", rng.integers(0, 256, (32, 1, 1, 32), dtype=np.uint8),
                   scale=0.002, zero_point=128)
    bias = b.constant("b", rng.integers(-500, 500, 32).astype(np.int32),
                      scale=0.00004, zero_point=0)
    y = b.tensor("y", (1, 64, 64, 32), np.uint8, scale=0.05, zero_point=128)
    b.op("CONV_2D", [h, w, bias], [y], stride_w=1, stride_h=1, padding="SAME")
    b.output(y)
    return b.build()


@pytest.fixture
def held():
    hold = Hold()
    s = InferenceSession(held_then_tpu_model(), target="sim", plugins=[hold], cache=NO_CACHE)
    assert [r["kind"] for r in s.profile()] == ["plugin", "tpu"]
    hold.release.set()
    reference = s.run(frame())
    hold.release.clear()
    hold.entered.clear()
    yield s, hold, reference
    hold.release.set()
    s.close()


def test_close_waits_for_a_run_in_the_callers_thread_before_closing_the_stick(held):
    s, hold, reference = held
    got: dict = {}

    def caller():
        try:
            got["out"] = s.run(frame())
        except BaseException as e:  # noqa: BLE001
            got["error"] = e

    runner = threading.Thread(target=caller)
    runner.start()
    assert hold.entered.wait(TIMEOUT)               # the run is inside its plugin step
    closer = threading.Thread(target=s.close, kwargs={"cancel": True})
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close returned while a request was still running"
    with pytest.raises(SessionClosedError):          # refused while close waits
        s.run(frame())
    hold.release.set()
    runner.join(TIMEOUT)
    closer.join(TIMEOUT)
    assert "error" not in got, f"the running request failed: {got.get('error')!r}"
    assert np.array_equal(got["out"]["y"], reference["y"])
    assert not s.device.is_open                       # closed once the request was done
    with pytest.raises(SessionClosedError):
        s.reset()


def test_a_session_closed_from_inside_its_own_request_raises_session_closed():
    hold = Hold()
    s = InferenceSession(held_then_tpu_model(), target="sim", plugins=[hold], cache=NO_CACHE)
    hold.release.set()
    hold.action = s.close                           # the kernel closes its own session
    with pytest.raises(SessionClosedError, match="closed while this request ran"):
        s.run(frame())
    assert not s.device.is_open


def test_a_session_closed_from_a_futures_callback_closes_entirely(caplog):
    hold = Hold()
    s = InferenceSession(held_then_tpu_model(), target="sim", plugins=[hold], cache=NO_CACHE)
    closed = threading.Event()

    def close_it(_future):
        s.close()                                   # runs in the session's worker thread
        closed.set()

    with caplog.at_level(logging.ERROR):
        future = s.submit(frame())
        future.add_done_callback(close_it)          # before the request can finish
        hold.release.set()
        assert closed.wait(TIMEOUT), "close from the callback never finished"
    assert future.result(0)["y"].shape == (1, 64, 64, 32)
    assert not s.device.is_open
    assert not [r for r in caplog.records if "callback" in r.getMessage()]
    with pytest.raises(SessionClosedError):
        s.run(frame())
