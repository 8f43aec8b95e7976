"""``strategy="replicate"``: the whole program on each of several simulated sticks,
each request on one free stick (coralrt._runtime.replicate), against a
single-stick run; and how ``strategy`` chooses between replicate and pipeline."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.models import conv_chain

from coralrt import InferenceSession
from coralrt._compile.cache import CompileCache
from coralrt.errors import (
    ConfigError, DeviceError, DeviceLostError, InferenceTimeoutError, QueueFullError,
)
from coralrt._runtime.executor import ExecutorProgram
from coralrt._runtime.pipeline import PipelinedProgram
from coralrt._runtime.replicate import ReplicatedProgram
from coralrt.testing import LatencyModel, SimulatedBackend
from coralrt import open_device

TIMEOUT = 10.0
NO_CACHE = CompileCache(enabled=False)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))


def open_sticks(n: int, **kw):
    backend = SimulatedBackend(n_devices=n, firmware_loaded=True, latency=LatencyModel(),
                               time_scale=1.0, transcript_limit=None, **kw)
    return backend, [open_device(f"usb:{i}", backend=backend) for i in range(n)]


@pytest.fixture(params=[2, 4], ids=["2-sticks", "4-sticks"])
def sticks(request):
    backend, devices = open_sticks(request.param)
    yield backend, devices
    for d in devices:
        d.close()


def feeds(n: int) -> list[np.ndarray]:
    return [np.random.default_rng(300 + i).integers(0, 256, (1, 64, 64, 32), np.uint8)
            for i in range(n)]


@pytest.fixture(scope="module")
def reference():
    """Outputs of a single-stick session, by feed index."""
    model = conv_chain(1)
    with InferenceSession(model, target="sim", cache=NO_CACHE) as s:
        assert [r["kind"] for r in s.profile()] == ["tpu"]
        return model, [s.run(x) for x in feeds(24)]


def same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def runs_per_stick(backend) -> list[int]:
    ops = [e["device"] for e in backend.transcript if e["op"] == "run"]
    return [ops.count(i) for i in range(len(backend.devices))]


# -- choosing the strategy ------------------------------------------------------------------

def test_one_segment_replicates_by_default_and_several_pipeline(sticks):
    _, devices = sticks
    with InferenceSession(conv_chain(1), target="sim", device=devices, cache=NO_CACHE) as s:
        assert isinstance(s._program, ReplicatedProgram)
        assert s._program.concurrency == len(devices)
    with InferenceSession(conv_chain(2), target="sim", device=devices, cache=NO_CACHE,
                          partition_mode="multi") as s:
        assert isinstance(s._program, PipelinedProgram)
    with InferenceSession(conv_chain(1), target="sim", device=devices, cache=NO_CACHE,
                          strategy="pipeline") as s:
        assert isinstance(s._program, PipelinedProgram)
    with InferenceSession(conv_chain(2), target="sim", device=devices, cache=NO_CACHE,
                          strategy="replicate") as s:
        replicas = s._program.replicas
        assert all(sum(st.kind == "tpu" for st in r.steps) == 2 for r in replicas)
        cpu_steps = [st.run for r in replicas for st in r.steps if st.kind == "cpu"]
        assert cpu_steps and len({id(f) for f in cpu_steps}) == len(cpu_steps)  # per replica
        x = feeds(1)[0]
        got = [f.result(TIMEOUT) for f in [s.submit(x) for _ in range(2 * len(devices))]]
        assert all(same(g, got[0]) for g in got)
        with InferenceSession(conv_chain(2), target="sim", cache=NO_CACHE,
                              partition_mode="multi") as one:
            assert same(one.run(x), got[0])


def test_unknown_strategy_is_a_config_error_and_one_device_ignores_it():
    backend, (d0,) = open_sticks(1)
    try:
        with pytest.raises(ConfigError, match="unknown strategy 'mirror'"):
            InferenceSession(conv_chain(1), target="sim", device=[d0], strategy="mirror",
                             cache=NO_CACHE)
        with InferenceSession(conv_chain(1), target="sim", device=d0, strategy="replicate",
                              cache=NO_CACHE) as s:
            assert isinstance(s._program, ExecutorProgram)
    finally:
        d0.close()


# -- replicated requests --------------------------------------------------------------------

def test_replicated_outputs_equal_a_single_stick_and_requests_spread(sticks, reference):
    backend, devices = sticks
    model, want = reference
    xs = feeds(len(want))
    with InferenceSession(model, target="sim", device=devices, strategy="replicate",
                          max_pending=8, cache=NO_CACHE) as s:
        replicas = s._program.replicas
        cpu_runs = {id(st.run) for r in replicas for st in r.steps if st.kind == "cpu"}
        assert len(cpu_runs) in (0, len(replicas))       # own CPU interpreters, if any
        futures = [s.submit(x) for x in xs]
        got = [f.result(TIMEOUT) for f in futures]        # each future: its own request
        assert all(same(g, w) for g, w in zip(got, want))
        assert all(same(s.run(x), w) for x, w in zip(xs[:3], want[:3]))
        stats = s.stats()["replicas"]
        assert sum(r["requests"] for r in stats) == len(xs) + 3
    per_stick = runs_per_stick(backend)
    assert all(n > 0 for n in per_stick), per_stick        # every stick ran some
    assert sum(per_stick) == len(xs) + 3


def test_concurrent_run_callers_use_any_free_stick(sticks, reference):
    backend, devices = sticks
    model, want = reference
    xs = feeds(len(want))
    errors, got = [], {}
    n = len(devices)
    barrier = threading.Barrier(n)
    with InferenceSession(model, target="sim", device=devices, cache=NO_CACHE) as s:
        def caller(k):
            try:
                barrier.wait(TIMEOUT)
                for j in range(k, len(xs), n):
                    got[j] = s.run(xs[j])
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 3)
    assert not errors
    assert all(same(got[j], want[j]) for j in range(len(xs)))
    assert sum(n > 0 for n in runs_per_stick(backend)) >= 2


def test_a_failing_stick_fails_its_own_request_and_the_others_serve_the_rest(reference):
    model, want = reference
    backend, devices = open_sticks(2)
    xs = feeds(len(want))
    try:
        with InferenceSession(model, target="sim", device=devices, cache=NO_CACHE) as s:
            assert same(s.run(xs[0]), want[0])
            backend.inject("stall", device=1)             # its next transfer stalls
            futures = [s.submit(x) for x in xs]
            outcomes = []
            for f, w in zip(futures, want):
                try:
                    outcomes.append(same(f.result(TIMEOUT), w))
                except DeviceError as e:
                    outcomes.append(e)
            failures = [o for o in outcomes if isinstance(o, DeviceError)]
            assert len(failures) == 1                     # only the request on that stick
            assert all(o is True for o in outcomes if not isinstance(o, DeviceError))
            stats = s.stats()["replicas"]
            assert stats[1]["failed"] and not stats[0]["failed"]
            before = runs_per_stick(backend)
            assert all(same(s.run(x), w) for x, w in zip(xs[:4], want[:4]))
            assert runs_per_stick(backend)[1] == before[1]   # set aside
            s.reset()                                     # brings it back into service
            assert not any(r["failed"] for r in s.stats()["replicas"])
            futures = [s.submit(x) for x in xs]
            assert all(same(f.result(TIMEOUT), w) for f, w in zip(futures, want))
            assert runs_per_stick(backend)[1] > before[1]
    finally:
        for d in devices:
            d.close()


def test_when_every_stick_failed_run_says_so(reference):
    model, want = reference
    backend, devices = open_sticks(2)
    x = feeds(1)[0]
    try:
        with InferenceSession(model, target="sim", device=devices, cache=NO_CACHE) as s:
            for i in range(2):
                backend.inject("stall", device=i)
            errors = []
            for _ in range(2):
                try:
                    s.run(x)
                except DeviceError as e:
                    errors.append(e)
            assert len(errors) == 2
            with pytest.raises(DeviceLostError, match="every stick .* failed"):
                s.run(x)
            with pytest.raises(DeviceLostError, match="every stick"):
                s.submit(x).result(TIMEOUT)
            s.reset()
            assert same(s.run(x), want[0])
    finally:
        for d in devices:
            d.close()


def test_timeout_on_a_replica_resyncs_that_stick(reference):
    model, want = reference
    backend = SimulatedBackend(n_devices=2, firmware_loaded=True, max_wait=2.0,
                               latency=LatencyModel(usb="usb2"), time_scale=20.0)
    devices = [open_device(f"usb:{i}", backend=backend) for i in range(2)]
    xs = feeds(4)
    try:
        with InferenceSession(model, target="sim", device=devices, cache=NO_CACHE) as s:
            with pytest.raises(InferenceTimeoutError):
                s.run(xs[1], timeout=0.03)
            futures = [s.submit(x) for x in xs]
            assert all(same(f.result(TIMEOUT), w) for f, w in zip(futures, want))
    finally:
        for d in devices:
            d.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("coralrt-session")]


def test_pipelined_submit_keeps_overlapping_with_the_same_backpressure(sticks):
    _, devices = sticks
    model = conv_chain(2)
    xs = feeds(6)
    with InferenceSession(model, target="sim", cache=NO_CACHE, partition_mode="multi") as one:
        want = [one.run(x) for x in xs]
    with InferenceSession(model, target="sim", device=devices, cache=NO_CACHE,
                          partition_mode="multi", max_pending=2) as s:
        assert isinstance(s._program, PipelinedProgram)
        accepted, full = [], False
        for k in range(400):
            try:
                accepted.append((k % len(xs), s.submit(xs[k % len(xs)], block=False)))
            except QueueFullError:
                full = True
                break
        assert full                                      # the caller got ahead of the sticks
        for k, f in accepted:
            assert same(f.result(TIMEOUT), want[k])
        futures = [s.submit(x, timeout=TIMEOUT) for x in xs]   # blocking: all accepted
        assert all(same(f.result(TIMEOUT), w) for f, w in zip(futures, want))
