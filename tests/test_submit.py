"""``InferenceSession.submit`` on a worker thread, ``run(timeout=...)``, ``close``.

Requests that must stay running while the test looks at the queue go through
a plugin kernel ("Gate", on the CPU target) that waits until the test opens
its gate; requests on a stick go through the real driver to the simulated
stick, whose latency model makes device time real wall time.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time

import numpy as np
import pytest
from support.models import conv_chain

import coralrt
from coralrt import InferenceSession
from coralrt._compile.cache import CompileCache
from coralrt.errors import (
    ConfigError, CoralRTError, InferenceError, InferenceTimeoutError, InputError,
    QueueFullError, SessionClosedError,
)
from coralrt.testing import ModelBuilder, LatencyModel, SimulatedBackend, simulated_stick
from coralrt._usb.driver import UsbEdgeTpu

TIMEOUT = 10.0
NO_CACHE = CompileCache(enabled=False)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))


def session_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("coralrt-session")]


# -- a kernel the test holds back ------------------------------------------------------------

class Gate:
    """Plugin kernel "Gate": y = x + 1, once the gate is open (polls, so that an
    interrupt raised in the worker lands in Python code)."""

    def __init__(self):
        self.open = threading.Event()
        self.entered = threading.Semaphore(0)
        self.ran: list[float] = []
        self.interrupted: list[str] = []

    def kernel(self, inputs, op):
        self.entered.release()
        try:
            while not self.open.is_set():
                time.sleep(0.002)
        except BaseException as e:
            self.interrupted.append(type(e).__name__)
            raise
        self.ran.append(float(inputs[0][0, 0]))
        return [inputs[0] + 1]

    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        registry.add_kernel("Gate", self.kernel)


def gate_model():
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.float32)
    y = b.tensor("y", (1, 4), np.float32)
    b.op("Gate", [x], [y])
    b.output(y)
    return b.build()


def feed(v: float) -> np.ndarray:
    return np.full((1, 4), v, np.float32)


@pytest.fixture
def gated():
    gate = Gate()
    s = InferenceSession(gate_model(), target="cpu", plugins=[gate], max_pending=2)
    yield s, gate
    gate.open.set()
    s.close()


def wait_entered(gate: Gate) -> None:
    assert gate.entered.acquire(timeout=TIMEOUT), "the worker never started the request"


# -- submit -------------------------------------------------------------------------------

def test_submit_returns_at_once_and_results_come_in_order(gated):
    s, gate = gated
    assert not session_threads()                         # started lazily
    start = time.perf_counter()
    futures = [s.submit(feed(i)) for i in range(2)]
    assert time.perf_counter() - start < 1.0             # the gate is closed: nothing ran
    assert not any(f.done() for f in futures)
    wait_entered(gate)
    assert len(session_threads()) == 1                   # one worker per session
    gate.open.set()
    got = [f.result(TIMEOUT) for f in futures]
    assert [list(g) for g in got] == [["y"], ["y"]]
    assert [float(g["y"][0, 0]) for g in got] == [1.0, 2.0]
    assert gate.ran == [0.0, 1.0]                        # in submission order


def test_a_full_queue_blocks_or_raises_queue_full(gated):
    s, gate = gated
    first = s.submit(feed(0))
    wait_entered(gate)                                   # running: the queue is empty
    queued = [s.submit(feed(1)), s.submit(feed(2))]      # max_pending=2: now full
    with pytest.raises(QueueFullError) as info:
        s.submit(feed(3), block=False)
    assert info.value.max_pending == 2 and isinstance(info.value, RuntimeError)
    start = time.perf_counter()
    with pytest.raises(QueueFullError, match="within 0.1 s"):
        s.submit(feed(3), timeout=0.1)
    assert 0.08 < time.perf_counter() - start < 2.0
    # A blocked caller goes on once there is room.
    threading.Timer(0.1, gate.open.set).start()
    late = s.submit(feed(4))                             # blocks until the worker takes one
    assert [float(f.result(TIMEOUT)["y"][0, 0]) for f in [first, *queued, late]] == \
        [1.0, 2.0, 3.0, 5.0]


def test_input_errors_are_raised_by_submit_itself(gated):
    s, _ = gated
    with pytest.raises(InputError):
        s.submit(np.zeros((1, 4), np.int32))
    with pytest.raises(InputError):
        s.submit({"nope": feed(0)})


def test_outputs_never_alias_each_other_or_the_inputs():
    model = conv_chain(2)
    with InferenceSession(model, target="sim", cache=NO_CACHE) as s:
        assert sum(r["kind"] == "tpu" for r in s.profile()) == 2
        feeds = [np.random.default_rng(i).integers(0, 256, (1, 64, 64, 32), np.uint8)
                 for i in range(8)]
        futures = [s.submit(x) for x in feeds]
        got = [f.result(TIMEOUT) for f in futures]
        arrays = [a for g in got for a in g.values()]
        for i, a in enumerate(arrays):
            assert a.flags.owndata or a.base is not None
            assert not any(np.shares_memory(a, x) for x in feeds)
            assert not any(np.shares_memory(a, b) for b in arrays[i + 1:])
        for x, g in zip(feeds, got):
            assert all(np.array_equal(g[k], v) for k, v in s.run(x).items())


def test_a_failing_request_fails_its_future_only():
    s = InferenceSession(gate_model(), target="cpu", plugins=[Broken()])
    try:
        future = s.submit(feed(1))
        with pytest.raises(InferenceError, match="bad value"):
            future.result(TIMEOUT)
        Broken.fail = False
        assert float(s.submit(feed(1)).result(TIMEOUT)["y"][0, 0]) == 2.0
    finally:
        Broken.fail = True
        s.close()


class Broken:
    fail = True

    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        def kernel(inputs, op):
            if Broken.fail:
                raise ValueError("bad value")
            return [inputs[0] + 1]
        registry.add_kernel("Gate", kernel)


@pytest.mark.needs_litert("dynamic input shapes: the numpy backend runs static shapes only")
def test_dynamic_shapes_resize_in_the_worker():
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.float32, shape_signature=(-1, 4))
    y = b.tensor("y", (1, 4), np.float32, shape_signature=(-1, 4))
    b.op("RELU", [x], [y])
    b.output(y)
    with InferenceSession(b.build()) as s:
        feeds = [np.full((n, 4), -1.0 + n, np.float32) for n in (1, 3, 2, 3)]
        futures = [s.submit(f) for f in feeds]
        for f, x in zip(futures, feeds):
            assert np.array_equal(f.result(TIMEOUT)["y"], np.maximum(x, 0))


# -- close ---------------------------------------------------------------------------------

def test_close_waits_for_queued_requests(gated):
    s, gate = gated
    futures = [s.submit(feed(i)) for i in range(3)]
    threading.Timer(0.1, gate.open.set).start()
    s.close()
    assert [float(f.result(0)["y"][0, 0]) for f in futures] == [1.0, 2.0, 3.0]
    assert not session_threads()
    with pytest.raises(SessionClosedError):
        s.submit(feed(0))
    with pytest.raises(SessionClosedError):
        s.run(feed(0))
    with pytest.raises(SessionClosedError):
        s.run(feed(0), timeout=1.0)
    s.close()                                            # idempotent


def test_close_cancel_cancels_what_did_not_start(gated):
    s, gate = gated
    futures = [s.submit(feed(i)) for i in range(3)]
    wait_entered(gate)                                   # the first one runs
    threading.Timer(0.2, gate.open.set).start()
    s.close(cancel=True)                                 # waits for the running one
    assert float(futures[0].result(0)["y"][0, 0]) == 1.0
    assert all(f.cancelled() for f in futures[1:])
    assert gate.ran == [0.0]
    assert not session_threads()
    assert isinstance(SessionClosedError("x"), CoralRTError)


def test_leaving_the_with_block_closes_and_leaves_no_thread():
    gate = Gate()
    gate.open.set()
    with InferenceSession(gate_model(), target="cpu", plugins=[gate]) as s:
        futures = [s.submit(feed(i)) for i in range(5)]
    assert all(f.done() for f in futures)
    assert not session_threads()


def test_options_are_checked():
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(ConfigError, match="max_pending"):
            InferenceSession(gate_model(), target="cpu", plugins=[Gate()], max_pending=bad)
    with pytest.raises(ConfigError, match="strategy"):
        InferenceSession(gate_model(), target="cpu", plugins=[Gate()], strategy="fastest")


# -- run(timeout=...) -----------------------------------------------------------------------

def test_run_timeout_raises_and_the_session_stays_usable(gated):
    s, gate = gated
    start = time.perf_counter()
    with pytest.raises(InferenceTimeoutError) as info:
        s.run(feed(5), timeout=0.1)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, CoralRTError)
    assert info.value.timeout == 0.1
    assert time.perf_counter() - start < 2.0
    deadline = time.monotonic() + TIMEOUT
    while not gate.interrupted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.interrupted == ["RequestTimedOut"]       # the worker was interrupted
    gate.open.set()
    assert float(s.run(feed(7), timeout=TIMEOUT)["y"][0, 0]) == 8.0
    assert float(s.run(feed(8))["y"][0, 0]) == 9.0
    assert gate.ran == [7.0, 8.0]                        # the late request never finished


def test_a_request_that_timed_out_while_queued_never_runs(gated):
    s, gate = gated
    first = s.submit(feed(1))
    wait_entered(gate)
    with pytest.raises(InferenceTimeoutError):
        s.run(feed(2), timeout=0.1)                      # still queued behind the first
    gate.open.set()
    assert float(first.result(TIMEOUT)["y"][0, 0]) == 2.0
    assert float(s.run(feed(3), timeout=TIMEOUT)["y"][0, 0]) == 4.0
    assert gate.ran == [1.0, 3.0]


def slow_stick(scale: float) -> UsbEdgeTpu:
    """A simulated stick whose outputs come ``scale`` times the USB 2 latency late."""
    backend = SimulatedBackend(firmware_loaded=True, lock_scope="process", max_wait=2.0,
                               latency=LatencyModel(usb="usb2"), time_scale=scale,
                               transcript_limit=None)
    device = UsbEdgeTpu(None, backend)
    device.open()
    return device


def test_a_timeout_mid_transfer_resets_the_stick_before_the_next_run(caplog):
    model = conv_chain(1, hw=64, c=32)
    feeds = [np.random.default_rng(i).integers(0, 256, (1, 64, 64, 32), np.uint8)
             for i in range(3)]
    with InferenceSession(model, target="sim", cache=NO_CACHE) as clean:
        want = [clean.run(x) for x in feeds]
    device = slow_stick(20.0)                            # about 0.15 s per run
    try:
        with InferenceSession(model, target="sim", device=device, cache=NO_CACHE) as s:
            assert all(np.array_equal(s.run(feeds[0])[k], v) for k, v in want[0].items())
            mark = len(device.backend.transcript)
            with pytest.raises(InferenceTimeoutError):
                s.run(feeds[1], timeout=0.05)           # the worker waits for the outputs
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="coralrt"):
                got = s.run(feeds[2], timeout=TIMEOUT)
            assert all(np.array_equal(got[k], v) for k, v in want[2].items())
            assert "interrupted mid-transfer" in caplog.text
            ops = [e["op"] for e in device.backend.transcript[mark:]]
            first_run = ops.index("run")
            assert "reset" in ops[first_run:]            # resynchronised after the timeout
            got = s.run(feeds[1])                        # and right for the abandoned input
            assert all(np.array_equal(got[k], v) for k, v in want[1].items())
    finally:
        device.close()
    assert not session_threads()


# -- the timing-only stick ----------------------------------------------------------------

def test_target_sim_never_uses_the_timing_only_stick(monkeypatch):
    assert "timing" not in inspect.signature(simulated_stick).parameters
    for name in ("CORALRT_SIM_TIMING_ONLY", "CORALRT_TIMING_ONLY"):
        monkeypatch.setenv(name, "1")
    model = conv_chain(1, hw=32, c=32)
    x = np.random.default_rng(0).integers(0, 256, (1, 32, 32, 32), np.uint8)
    with InferenceSession(model, target="sim", cache=NO_CACHE) as s, \
            InferenceSession(model, target="cpu", cpu_kernels="reference") as ref:
        assert [r["kind"] for r in s.profile()] == ["tpu"]
        assert s.device.backend.timing_only is False
        assert all(e.timing_only is False for e in (d.engine for d in s.device.backend.devices))
        got, want = s.run(x), ref.run(x)
        assert all(np.array_equal(got[k], v) for k, v in want.items())
        assert any(v.any() for v in got.values())


def test_timing_only_waits_the_estimate_and_answers_zeros(tmp_path):
    model = conv_chain(1, hw=64, c=32)
    backend = SimulatedBackend(firmware_loaded=True, lock_scope="process", timing_only=True,
                               latency=LatencyModel(usb="usb2"), time_scale=0.0)
    device = UsbEdgeTpu(None, backend)
    device.open()
    try:
        with InferenceSession(model, target="sim", device=device, cache=NO_CACHE) as s:
            x = np.full((1, 64, 64, 32), 200, np.uint8)
            s.run(x)
            start = time.perf_counter()
            got = s.run(x)
            took = time.perf_counter() - start
            estimate = [r for r in s.profile() if r["kind"] == "tpu"][0]["device_seconds"]
            assert estimate > 0.005 and took >= estimate * 0.95
            (name, out), = got.items()
            assert out.shape == (1, 64, 64, 32) and out.dtype == np.uint8 and not out.any()
            ops = [e["op"] for e in backend.transcript]
            assert "bulk_out" in ops and "bulk_in" in ops and "run" in ops   # the real path
    finally:
        device.close()


# -- many callers, one queue ----------------------------------------------------------------

class Slow:
    """Plugin kernel "Gate" that takes ``seconds`` per run."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def kernel(self, inputs, op):
        time.sleep(self.seconds)
        return [inputs[0] + 1]

    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        registry.add_kernel("Gate", self.kernel)


def test_timeouts_bound_the_wait_for_room_not_the_wait_for_the_producer_lock():
    """12 threads, each run 0.15 s, max_pending 2: a caller that waits for another
    caller to get into the queue still waits up to its own timeout (30 s), not one
    poll interval, before it is refused."""
    s = InferenceSession(gate_model(), target="cpu", plugins=[Slow(0.15)], max_pending=2)
    errors, results, lock = [], [], threading.Lock()

    def caller(i: int) -> None:
        try:
            if i % 2:
                out = s.submit(feed(i), timeout=30).result(60)
            else:
                out = s.run(feed(i), timeout=30)
            with lock:
                results.append((i, float(out["y"][0, 0])))
        except Exception as e:   # noqa: BLE001 - every failure is reported below
            with lock:
                errors.append(f"{i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(12)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        s.close()
    assert not errors, errors
    assert sorted(results) == [(i, i + 1.0) for i in range(12)]
