"""Two ways real sticks misbehave, simulated, and what the real driver does about them.

Neither was observed on hardware by this project; both follow public reports
(docs/usb.md, "Sticks that misbehave"):

* enumerated but not ready ("not_ready" fault): after the firmware download
  (or a port reset) the stick shows up as 18d1:9302 at once, but for a while
  its transfers fail.  libedgetpu sleeps 1 s before every open attempt because
  that "seems to reduce chances of transfer errors" (usb_driver.cc,
  users-and-benchmarks.md §1.3); RingCanary/coral-usb-oxidized calls the state
  *Enumerated-But-Unusable* (§1.4).  The driver waits, retrying the first
  register read with a growing pause, within ``ready_timeout``;
* wedged ("wedge" fault): after a transfer times out the stick answers nothing
  until it is unplugged and replugged: "the LED keeps blinking and only a
  replug helps" (edgetpu#70, edgetpu#237, users-and-benchmarks.md §1.4);
  "CSR reads time out ... software writes do not recover it" (OXI §8.1-8.2,
  edgetpu-stack.md §1.10).  The driver says so (``DeviceWedgedError``,
  "replug") instead of retrying, and after the replug the same device object
  (``reset()``) or session (``session.reset()``) works again.

Every run goes through ``open_device`` / ``UsbEdgeTpu`` over a
``SimulatedBackend``; DWN1 runs use the test suite's switch that lets DWN1
streams through (what is checked is the driver's transfers, not outputs), and
the session test checks bit-exact outputs of a coralrt segment.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from support.sim import dwn1_backend, isolated_dirs, program  # noqa: F401 (fixtures)

from coralrt.errors import (
    DeviceLostError, DeviceNotReadyError, DeviceTimeoutError, DeviceWedgedError,
)
from coralrt.testing import FaultPlan, SimulatedBackend
from coralrt import open_device
from coralrt._usb.driver import UsbEdgeTpu

TIMEOUT = 0.5         # the driver's transfer timeout
MAX_WAIT = 0.1        # what a simulated timeout really waits
SLACK = 1.0           # scheduling margin
FIRMWARE = b"\x02" * 300


def _one_run(dev, program):
    h = dev.load(program)
    return dev.run(h, [np.zeros(layer.shape, np.uint8) for layer in h.exe.inputs])


def _ops(b, mark=0):
    return [e["op"] for e in list(b.transcript)[mark:]]


# -- enumerated but not ready --------------------------------------------------------------

@pytest.mark.parametrize("error", ["io", "pipe", "timeout"])
def test_a_stick_not_ready_after_the_firmware_download_is_waited_for(program, error):
    b = dwn1_backend(firmware_loaded=False, max_wait=MAX_WAIT)
    b.inject("not_ready", seconds=0.3, error=error)
    start = time.monotonic()
    with open_device(backend=b, timeout=TIMEOUT, firmware=FIRMWARE,
                     ready_timeout=3.0) as dev:
        elapsed = time.monotonic() - start
        assert 0.3 <= elapsed < 0.3 + SLACK
        assert _one_run(dev, program)[0].shape == (1, 1001)
    ops = _ops(b)
    assert ops.index("reenumerate") < ops.index("not_ready")   # after the download
    attempts = ops.count("not_ready")
    # Waited, not spun: the pause grows from 10 ms to 100 ms (a timed-out attempt
    # waits MAX_WAIT itself).
    assert 1 <= attempts <= 10, attempts
    reads = [e for e in b.transcript if e["op"] == "read"]
    assert reads[0]["register"] == 0x1A30C                      # scu_ctrl_0, as in the trace


def test_not_ready_is_also_waited_for_after_a_port_reset(program):
    b = dwn1_backend(max_wait=MAX_WAIT)
    b.inject("not_ready", seconds=0.15)       # the port reset of open() starts the window
    with open_device(backend=b, timeout=TIMEOUT) as dev:
        assert _one_run(dev, program)[0].shape == (1, 1001)
        b.inject("not_ready", seconds=0.15)   # ... and so does reset()
        dev.reset()
        assert _one_run(dev, program)[0].shape == (1, 1001)
    assert _ops(b).count("not_ready") >= 2


@pytest.mark.parametrize("error", ["io", "timeout"])
def test_a_stick_not_ready_past_the_bound_gives_a_typed_error_that_says_replug(program, error):
    from coralrt._usb.lock import lock_dir

    b = dwn1_backend(firmware_loaded=False, max_wait=MAX_WAIT)
    b.inject("not_ready", seconds=1.2, error=error)
    start = time.monotonic()
    with pytest.raises(DeviceNotReadyError) as info:
        open_device(backend=b, timeout=TIMEOUT, firmware=FIRMWARE, ready_timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 0.3 + TIMEOUT + SLACK
    text = str(info.value)
    assert "18d1:9302" in text and "did not answer" in text and "replug" in text
    assert isinstance(info.value, DeviceTimeoutError) and info.value.timeout == 0.3
    assert b.devices[0].claimed_by is None                      # interface released
    assert not list(lock_dir().glob("*.pid"))                   # and the lock
    time.sleep(max(0.0, 1.3 - elapsed))                         # the window ends
    with open_device(backend=b, timeout=TIMEOUT) as dev:
        assert _one_run(dev, program)[0].shape == (1, 1001)


def test_not_ready_fault_plan_and_validation():
    plan = FaultPlan().add("not_ready", seconds=0.1, error="pipe").add("wedge", after=3)
    assert [(f.kind, f.error) for f in plan.faults] == [("not_ready", "pipe"), ("wedge", "io")]
    with pytest.raises(ValueError, match="not_ready error"):
        FaultPlan().add("not_ready", error="nonsense")


# -- wedged --------------------------------------------------------------------------------

@pytest.mark.parametrize("after", [0, 3])
def test_a_wedged_stick_says_replug_in_bounded_time_and_the_same_device_recovers(program,
                                                                                 after):
    b = dwn1_backend(max_wait=MAX_WAIT)
    dev = open_device(backend=b, timeout=TIMEOUT, ready_timeout=0.4)
    _one_run(dev, program)
    b.inject("wedge", after=after)
    mark = len(b.transcript)
    start = time.monotonic()
    with pytest.raises(DeviceWedgedError) as info:
        _one_run(dev, program)
    assert time.monotonic() - start < TIMEOUT + SLACK
    assert "replug" in str(info.value) and "wedged" in str(info.value)
    assert isinstance(info.value, DeviceLostError)
    # No retry loop: the transfer that timed out, the interrupt poll, one register read.
    assert _ops(b, mark).count("timeout") <= 3

    mark = len(b.transcript)
    start = time.monotonic()
    with pytest.raises(DeviceLostError, match="replug"):
        _one_run(dev, program)                          # refused at once, no transfer
    assert time.monotonic() - start < MAX_WAIT
    assert not [op for op in _ops(b, mark) if op in ("read", "write", "bulk_out", "bulk_in")]

    start = time.monotonic()                            # a reset cannot help ...
    with pytest.raises(DeviceNotReadyError, match="replug"):
        dev.reset()
    assert time.monotonic() - start < 0.4 + TIMEOUT + SLACK
    with pytest.raises(DeviceLostError, match="replug"):
        _one_run(dev, program)                          # ... and runs stay refused at once

    b.replug(0)                                         # what the user is told to do
    dev.reset()                                         # the same device object
    assert _one_run(dev, program)[0].shape == (1, 1001)
    dev.close()


def test_a_wedged_stick_comes_back_in_bootloader_mode_after_a_replug(program):
    b = dwn1_backend(firmware_loaded=False, max_wait=MAX_WAIT)
    dev = open_device(backend=b, timeout=TIMEOUT, firmware=FIRMWARE, ready_timeout=0.3)
    _one_run(dev, program)
    b.inject("wedge")
    with pytest.raises(DeviceWedgedError):
        _one_run(dev, program)
    start = time.monotonic()
    dev.close()                                         # bounded: no halt on a failed stick
    assert time.monotonic() - start < MAX_WAIT + SLACK
    with pytest.raises(DeviceNotReadyError, match="replug"):
        open_device(backend=b, timeout=TIMEOUT, firmware=FIRMWARE, ready_timeout=0.3)
    b.replug(0, mode="bootloader")                      # as a real stick comes back
    with open_device(backend=b, timeout=TIMEOUT, firmware=FIRMWARE) as again:  # a new one
        assert _one_run(again, program)[0].shape == (1, 1001)
    assert b.devices[0].firmware_sha256 is not None


def test_a_stick_that_wedges_during_the_open_fails_that_open_and_the_next_says_replug():
    b = dwn1_backend(max_wait=MAX_WAIT)
    b.inject("wedge", after=10)                         # in the middle of the bring-up
    with pytest.raises(DeviceTimeoutError):
        open_device(backend=b, timeout=TIMEOUT, ready_timeout=0.3)
    with pytest.raises(DeviceNotReadyError, match="replug"):
        open_device(backend=b, timeout=TIMEOUT, ready_timeout=0.3)
    b.replug(0)
    with open_device(backend=b, timeout=TIMEOUT) as dev:
        assert dev.is_open


def test_a_plain_timeout_is_not_taken_for_a_wedge(program):
    b = dwn1_backend(max_wait=MAX_WAIT)
    dev = open_device(backend=b, timeout=TIMEOUT)
    _one_run(dev, program)
    b.inject("timeout")
    with pytest.raises(DeviceTimeoutError) as info:
        _one_run(dev, program)
    assert not isinstance(info.value, DeviceWedgedError)
    with pytest.raises(DeviceLostError, match="close it and open it again"):
        _one_run(dev, program)
    dev.reset()                                         # no replug needed
    assert _one_run(dev, program)[0].shape == (1, 1001)
    dev.close()


def test_a_session_on_a_wedged_stick_gives_right_outputs_again_after_replug_and_reset():
    from coralrt import InferenceSession
    from coralrt._compile.cache import CompileCache
    from support.models import conv_chain

    model = conv_chain(1, 16, 8, 0)
    opts = dict(target="sim", cache=CompileCache(enabled=False))
    rng = np.random.default_rng(0)
    with InferenceSession(model, **opts) as ref:
        feeds = [{t.name: rng.integers(0, 256, t.shape, np.uint8) for t in ref.get_inputs()}
                 for _ in range(3)]
        want = [ref.run(f) for f in feeds]
    backend = SimulatedBackend(firmware_loaded=True, time_scale=0.0, max_wait=MAX_WAIT,
                               lock_scope="process")
    device = UsbEdgeTpu(None, backend, timeout=TIMEOUT, ready_timeout=0.3)
    device.open()
    with InferenceSession(model, device=device, **opts) as s:
        assert all(np.array_equal(s.run(feeds[0])[k], want[0][k]) for k in want[0])
        backend.inject("wedge", after=1)
        with pytest.raises(DeviceWedgedError, match="replug"):
            s.run(feeds[1])
        with pytest.raises(DeviceLostError, match="replug"):
            s.run(feeds[1])
        backend.replug(0)
        s.reset()
        got = s.run(feeds[2])
        assert all(np.array_equal(got[k], want[2][k]) for k in want[2])
    device.close()
