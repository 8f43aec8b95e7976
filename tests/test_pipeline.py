"""Pipelining a program's Edge TPU segments across two simulated sticks
(coralrt._runtime.pipeline): same outputs as the unpipelined program,
concurrent callers, failures reaching the caller, shutdown, and two
independent sessions on two sticks in one process.  No real stick is used:
the sticks are the simulated USB backend with its latency model, so device
time is real wall time."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from support.models import conv_chain
from support.sim import isolated_dirs  # noqa: F401 (fixtures)

from coralrt import InferenceSession
from coralrt._backends import get_backend
from coralrt._compile.cache import CompileCache
from coralrt._compile.jit import jit_compile
from coralrt._runtime.executor import ExecutorProgram, Step, build_program
from coralrt._runtime.pipeline import PipelinedProgram, build_pipelined_program, stages_of
from coralrt.errors import ConfigError, DeviceError, InferenceError, InputError
from coralrt.testing import LatencyModel
from coralrt import open_device
from coralrt.testing import SimulatedBackend

TIMEOUT = 10.0


def compiled(segments: int = 2, **kw):
    jit = jit_compile(conv_chain(segments, **kw), mode="multi", cache=CompileCache(enabled=False))
    assert jit.compile_info["segments"] == segments
    return jit.model


def inputs(n: int, hw: int = 64, c: int = 32) -> list[list[np.ndarray]]:
    return [[np.random.default_rng(100 + i).integers(0, 256, (1, hw, hw, c), np.uint8)]
            for i in range(n)]


@pytest.fixture
def sticks():
    backend = SimulatedBackend(n_devices=2, firmware_loaded=True, latency=LatencyModel(),
                               time_scale=1.0)
    devices = [open_device("usb:0", backend=backend), open_device("usb:1", backend=backend)]
    yield backend, devices
    for d in devices:
        d.close()


@pytest.fixture(scope="module")
def cpu():
    return get_backend(None)


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# -- correctness ---------------------------------------------------------------------------

def test_pipelined_outputs_equal_the_unpipelined_program(sticks, cpu):
    backend, (d0, d1) = sticks
    model = compiled(2)
    plain = build_program(model, device=d0, backend=cpu)
    feeds = inputs(24)
    want = [plain.run(x) for x in feeds]
    assert len({w[0].tobytes() for w in want}) == len(feeds)     # inputs matter
    with build_pipelined_program(model, devices=[d0, d1], backend=cpu) as program:
        assert [s.device for s in program.stages] == [d0, d1]
        assert [len(s.steps) for s in program.stages] == [2, 1]  # TPU + CPU, TPU
        futures = [program.submit(x) for x in feeds]
        got = [f.result(TIMEOUT) for f in futures]
        assert all(same(g, w) for g, w in zip(got, want))
        assert same(program.run(feeds[3], timeout=TIMEOUT), want[3])
        rows = program.profile()
        assert [r["device"] for r in rows if r["kind"] == "tpu"] == ["usb:0", "usb:1"]
        assert all(r["device_seconds"] > 0 for r in rows if r["kind"] == "tpu")
        assert program.stats()["completed"] == len(feeds) + 1
    # both sticks really ran a segment
    runs = [e["device"] for e in backend.transcript if e["op"] == "run"]
    assert runs.count(0) >= len(feeds) and runs.count(1) >= len(feeds)


def test_segment_i_runs_on_device_i_mod_n(sticks, cpu):
    _, (d0, d1) = sticks
    model = compiled(3)
    program = build_program(model, device=None, devices=[d0, d1], backend=cpu)
    tpu = [s.device for s in program.steps if s.kind == "tpu"]
    assert tpu == [d0, d1, d0]
    assert [len(s.steps) for s in stages_of(program.steps)] == [2, 2, 1]
    plain = build_program(model, device=d0, backend=cpu)
    with PipelinedProgram(program, depth=1) as pipelined:
        for x in inputs(6):
            assert same(pipelined.run(x, timeout=TIMEOUT), plain.run(x))


def test_build_program_device_arguments(sticks, cpu):
    _, (d0, d1) = sticks
    model = compiled(2)
    with pytest.raises(ConfigError, match="not both"):
        build_program(model, device=d0, devices=[d0, d1], backend=cpu)
    with pytest.raises(ConfigError, match="empty"):
        build_program(model, device=None, devices=[], backend=cpu)
    with pytest.raises(ConfigError, match="twice"):
        build_pipelined_program(model, devices=[d0, d0], backend=cpu)
    with pytest.raises(ConfigError, match="depth"):
        build_pipelined_program(model, devices=[d0, d1], backend=cpu, depth=0)
    single = build_program(model, device=d0, backend=cpu)   # unchanged behaviour
    assert {s.device for s in single.steps if s.kind == "tpu"} == {d0}


def test_concurrent_callers_each_get_their_own_result(sticks, cpu):
    _, (d0, d1) = sticks
    model = compiled(2)
    feeds = inputs(8 * 5)
    plain = build_program(model, device=d0, backend=cpu)
    want = [plain.run(x) for x in feeds]
    errors, got = [], {}
    barrier = threading.Barrier(8)
    with build_pipelined_program(model, devices=[d0, d1], backend=cpu) as program:
        def caller(k: int) -> None:
            try:
                barrier.wait(TIMEOUT)
                for j in range(k, len(feeds), 8):
                    with program.lock:            # what InferenceSession.run does
                        got[j] = program.run(feeds[j], timeout=TIMEOUT)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 3)
    assert not errors
    assert sorted(got) == list(range(len(feeds)))
    assert all(same(got[j], want[j]) for j in range(len(feeds)))


def test_requests_from_different_callers_overlap(cpu):
    # USB 2 transfer rates make device time dominate the simulated stick's host work.
    backend = SimulatedBackend(n_devices=2, firmware_loaded=True,
                               latency=LatencyModel(usb="usb2"), time_scale=1.0)
    d0, d1 = open_device("usb:0", backend=backend), open_device("usb:1", backend=backend)
    try:
        model = compiled(2)
        feeds = inputs(16)
        with build_pipelined_program(model, devices=[d0, d1], backend=cpu) as program:
            program.run(feeds[0], timeout=TIMEOUT)
            start = time.perf_counter()
            def call(x):
                with program.lock:                # what InferenceSession.run does
                    program.run(x, timeout=TIMEOUT)
            threads = [threading.Thread(target=call, args=(x,)) for x in feeds]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
            wall = time.perf_counter() - start
            busy = [s["busy_seconds"] for s in program.stats()["stages"]]
        # Serial execution would take the sum of the stages' busy time.
        assert wall < 0.8 * sum(busy), (wall, busy)
    finally:
        d0.close()
        d1.close()


# -- failures ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["stall", "timeout"])
def test_a_stick_fault_reaches_the_caller_and_the_pipeline_recovers(sticks, cpu, fault):
    backend, (d0, d1) = sticks
    model = compiled(2)
    feeds = inputs(4)
    plain = build_program(model, device=d0, backend=cpu)
    want = [plain.run(x) for x in feeds]
    with build_pipelined_program(model, devices=[d0, d1], backend=cpu) as program:
        assert same(program.run(feeds[0], timeout=TIMEOUT), want[0])
        backend.inject(fault, device=1)
        start = time.perf_counter()
        with pytest.raises(DeviceError):
            program.submit(feeds[1]).result(TIMEOUT)
        assert time.perf_counter() - start < TIMEOUT
        with pytest.raises(DeviceError, match="close it and open it again"):
            program.run(feeds[1], timeout=TIMEOUT)       # the stick stays failed ...
        assert program.broken is None                    # ... the pipeline does not
        d1.close()
        d1.open()                                         # resets the stick
        for x, w in zip(feeds, want):
            assert same(program.run(x, timeout=TIMEOUT), w)


def fake_program(*runs, outputs=(1,)) -> ExecutorProgram:
    """A program of CPU-like steps; step k maps tensor k to tensor k + 1."""
    steps = [Step("tpu" if k else "cpu", f"fake {k}", [k], [k], [k + 1], fn)
             for k, fn in enumerate(runs)]
    return ExecutorProgram(steps, [0], list(outputs))


def test_a_non_coralrt_exception_is_wrapped_and_later_requests_run():
    def flaky(args):
        if int(args[0][0]) == 13:
            raise ValueError("unlucky")
        return [args[0] + 1]
    with PipelinedProgram(fake_program(flaky, lambda a: [a[0] * 2], outputs=(2,))) as p:
        with pytest.raises(InferenceError, match="stage 0.*ValueError: unlucky") as info:
            p.run([np.array([13])], timeout=TIMEOUT)
        assert isinstance(info.value.__cause__, ValueError)
        assert p.run([np.array([1])], timeout=TIMEOUT)[0][0] == 4
        assert p.broken is None


def test_a_dead_worker_marks_the_pipeline_broken():
    gate = threading.Event()

    def deadly(args):
        gate.wait(TIMEOUT)
        raise SystemExit("worker killed")
    p = PipelinedProgram(fake_program(lambda a: [a[0] + 1], deadly, outputs=(2,)), depth=2)
    futures = [p.submit([np.array([i])]) for i in range(3)]
    gate.set()
    for f in futures:
        with pytest.raises(InferenceError, match="broken.*worker killed"):
            f.result(TIMEOUT)
    assert isinstance(p.broken, SystemExit)
    with pytest.raises(InferenceError, match="broken"):
        p.submit([np.array([1])])
    p.close(timeout=TIMEOUT)
    assert not any(t.is_alive() for t in p._threads)


def test_run_timeout_and_cancel():
    release = threading.Event()
    p = PipelinedProgram(fake_program(lambda a: [a[0] + 1] if release.wait(TIMEOUT) else None),
                         depth=1)
    with pytest.raises(InferenceError, match="within 0.05 s"):
        p.run([np.array([1])], timeout=0.05)
    waiting = p.submit([np.array([2])])                  # queued behind the first
    assert waiting.cancel()
    release.set()
    assert p.run([np.array([3])], timeout=TIMEOUT)[0][0] == 4
    assert waiting.cancelled()
    p.close()


# -- shutdown ------------------------------------------------------------------------------

def test_close_finishes_queued_requests_then_refuses_new_ones():
    slow = fake_program(lambda a: (time.sleep(0.01), [a[0] + 1])[1], lambda a: [a[0] * 10],
                        outputs=(2,))
    p = PipelinedProgram(slow, depth=2)
    futures = [p.submit([np.array([i])]) for i in range(6)]
    p.close(timeout=TIMEOUT)
    assert [f.result(0)[0][0] for f in futures] == [(i + 1) * 10 for i in range(6)]
    assert all(not t.is_alive() and t.daemon for t in p._threads)
    with pytest.raises(InferenceError, match="closed"):
        p.run([np.array([1])])
    p.close()                                             # idempotent
    with pytest.raises(InputError):
        PipelinedProgram(slow).submit([])


def test_an_unreferenced_pipeline_stops_its_workers():
    import gc
    p = PipelinedProgram(fake_program(lambda a: [a[0] + 1]))
    threads = list(p._threads)
    assert p.run([np.array([1])], timeout=TIMEOUT)[0][0] == 2
    del p
    gc.collect()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)


def test_lock_does_not_serialise_callers():
    p = PipelinedProgram(fake_program(lambda a: [a[0]]))
    entered = threading.Event()

    def other():
        with p.lock:
            entered.set()
    with p.lock:
        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(TIMEOUT)
    t.join()
    p.close()


# -- independent sessions on two sticks ------------------------------------------------------

def test_two_sessions_on_two_sticks_run_concurrently(sticks, tmp_path):
    _, (d0, d1) = sticks
    cache = CompileCache(tmp_path / "cache")
    models = [conv_chain(2, seed=1), conv_chain(1, hw=48, c=48, seed=2)]
    sessions = [InferenceSession(m, target="sim", device=d, cache=cache)
                for m, d in zip(models, (d0, d1))]
    cpu_sessions = [InferenceSession(m, target="cpu") for m in models]
    feeds = [inputs(12), inputs(12, hw=48, c=48)]
    want = [[s.run(x[0])[s.get_outputs()[0].name] for x in f]
            for s, f in zip(sessions, feeds)]
    for w, s, f in zip(want, cpu_sessions, feeds):   # the sticks compute the real model
        for got, x in zip(w, f):
            ref = s.run(x[0])[s.get_outputs()[0].name]
            assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1
    errors = []
    running = threading.Barrier(2)

    def loop(k: int) -> None:
        try:
            running.wait(TIMEOUT)
            for _ in range(3):
                for x, w in zip(feeds[k], want[k]):
                    out = sessions[k].run(x[0])[sessions[k].get_outputs()[0].name]
                    assert np.array_equal(out, w)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 3)
    assert not errors
    assert [s.device for s in sessions] == [d0, d1]


def test_session_pipelines_over_a_device_list():
    be = SimulatedBackend(n_devices=2, firmware_loaded=True, latency=LatencyModel(),
                          time_scale=1.0)
    d0, d1 = open_device("usb:0", backend=be), open_device("usb:1", backend=be)
    model = conv_chain(2)
    cache = CompileCache(enabled=False)
    ref = InferenceSession(model, target="sim", device=d0, cache=cache)
    with InferenceSession(model, target="sim", device=[d0, d1], cache=cache) as s:
        assert [d.path for d in s.devices] == ["usb:0", "usb:1"]
        xs = inputs(12)
        name = s.get_outputs()[0].name
        want = [ref.run(x[0])[name] for x in xs]
        futures = [s.submit(x[0]) for x in xs]
        for f, w in zip(futures, want):
            np.testing.assert_array_equal(f.result(10)[name], w)
        got = {}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, s.run(xs[i][0])[name]))
                   for i in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, w in enumerate(want):
            np.testing.assert_array_equal(got[i], w)
        assert {step["device"] for step in s.profile() if step["kind"] == "tpu"} == \
            {"usb:0", "usb:1"}
    assert d0.is_open and d1.is_open  # the caller's sticks stay open
