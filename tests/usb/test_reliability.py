"""Faults on the simulated stick give the right coralrt error within the timeout,
the process survives, and reopening the stick recovers; a second process gets
DeviceBusyError while the first keeps running inferences.

The runs use a DWN1 executable on a simulated stick that lets DWN1 streams
through (the test-only switch of ``tests/support/sim.py``): what is checked is
the driver's transfers, not outputs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import REPO_ROOT, shared_model
from support.sim import DWN1_MODEL, dwn1_backend, isolated_dirs, program  # noqa: F401 (fixtures)

from coralrt.errors import DeviceBusyError, DeviceError, DeviceLostError, DeviceTimeoutError
from coralrt import open_device
from coralrt.testing import SimulatedBackend

TIMEOUT = 0.5
SLACK = 1.0           # scheduling margin on top of the timeout


def _inputs(handle):
    return [np.zeros(layer.shape, np.uint8) for layer in handle.exe.inputs]


def _one_run(dev, program):
    h = dev.load(program)
    return dev.run(h, _inputs(h))


@pytest.mark.parametrize("kind, error, code", [
    ("timeout", DeviceTimeoutError, errno.ETIMEDOUT),
    ("stall", DeviceError, errno.EPIPE),
    ("disconnect", DeviceLostError, errno.ENODEV),
    ("fatal", DeviceLostError, None),
])
@pytest.mark.parametrize("after", [0, 2])
def test_fault_gives_typed_error_in_time_and_reopen_recovers(program, kind, error, code, after):
    b = dwn1_backend(max_wait=TIMEOUT)
    dev = open_device(backend=b, timeout=TIMEOUT)
    _one_run(dev, program)                     # warm: parameters cached
    b.inject(kind, after=after)
    start = time.monotonic()
    with pytest.raises(error) as info:
        _one_run(dev, program)
    elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT + SLACK, f"{kind}: error after {elapsed:.2f} s"
    if code is not None:
        assert info.value.errno == code
    if kind == "fatal":
        assert "fatal" in str(info.value)
    start = time.monotonic()                   # a failed device fails fast afterwards:
    with pytest.raises(DeviceLostError, match="close it and open it again"):
        _one_run(dev, program)
    assert time.monotonic() - start < TIMEOUT / 2   # no transfer waits for a timeout
    dev.close()
    if kind == "disconnect":
        b.replug(0)
    with open_device(backend=b, timeout=TIMEOUT) as again:
        out = _one_run(again, program)         # parameters uploaded again after the reset
        assert out[0].shape == (1, 1001)
    tags = [e["tag"] for e in b.transcript if e["op"] == "bulk_out"]
    assert tags.count(2) == 2


@pytest.mark.parametrize("usb_speed", ["usb3", "usb2"])
def test_a_fatal_interrupt_during_open_is_raised_by_open(program, usb_speed):
    from coralrt._usb.lock import lock_dir

    clean = dwn1_backend(max_wait=TIMEOUT, usb_speed=usb_speed)
    with open_device(backend=clean, timeout=TIMEOUT):
        transfers = clean.devices[0].transfers          # those of the open (bring-up)
    ops = [e["op"] for e in clean.transcript]
    # The bring-up puts the chip to sleep (EnableReset): the GCB reset clears a fatal
    # error raised up to the read that sees it asleep.
    asleep = sum(1 for op in ops[:ops.index("gcb_reset")] if op in ("read", "write")) + 1
    assert transfers > 40 and 5 < asleep < 15
    for after in range(transfers):                      # at every transfer of the open
        b = dwn1_backend(max_wait=TIMEOUT, usb_speed=usb_speed)
        b.inject("fatal", after=after)
        start = time.monotonic()
        if after < asleep:
            with open_device(backend=b, timeout=TIMEOUT) as dev:
                assert _one_run(dev, program)[0].shape == (1, 1001)
            continue
        with pytest.raises(DeviceLostError) as info:
            open_device(backend=b, timeout=TIMEOUT)
        assert time.monotonic() - start < TIMEOUT + SLACK
        text = str(info.value)
        assert "raised a fatal error while it was being opened" in text
        assert "hib_error_status 0x1" in text and "open it again" in text
        assert b.devices[0].claimed_by is None          # interface 0 released
        assert not list(lock_dir().glob("*.pid"))       # and the lock
        with open_device(backend=b, timeout=TIMEOUT) as dev:   # the reset clears it
            assert _one_run(dev, program)[0].shape == (1, 1001)


def test_slow_reenumeration_after_dfu_times_out_then_recovers(program):
    b = dwn1_backend(firmware_loaded=False, max_wait=TIMEOUT)
    b.inject("slow_reenumeration", seconds=1.5)
    start = time.monotonic()
    with pytest.raises(DeviceTimeoutError, match="18d1:9302") as info:
        open_device(backend=b, timeout=TIMEOUT, firmware=b"\x02" * 300,
                    reenumeration_timeout=0.4)
    elapsed = time.monotonic() - start
    assert 0.4 <= elapsed < 0.4 + SLACK and info.value.timeout == 0.4
    time.sleep(max(0.0, 1.6 - elapsed))
    with open_device(backend=b, timeout=TIMEOUT) as dev:      # it came back, running
        assert _one_run(dev, program)[0].shape == (1, 1001)


def test_slow_reenumeration_within_the_wait_succeeds(program):
    b = dwn1_backend(firmware_loaded=False, max_wait=TIMEOUT)
    b.inject("slow_reenumeration", seconds=0.3)
    start = time.monotonic()
    with open_device(backend=b, timeout=TIMEOUT, firmware=b"\x02" * 300,
                     reenumeration_timeout=3.0) as dev:
        assert time.monotonic() - start >= 0.3
        assert _one_run(dev, program)[0].shape == (1, 1001)


_HOLDER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from coralrt import load_model, open_device
    from tests.support.sim import dwn1_backend
    model = load_model(sys.argv[1])
    program = next(op.custom_options for op in model.main.operators
                   if op.name == "edgetpu-custom-op")
    dev = open_device(backend=dwn1_backend())
    h = dev.load(program)
    xs = [np.zeros(layer.shape, np.uint8) for layer in h.exe.inputs]
    dev.run(h, xs)
    print("ready", flush=True)
    sys.stdin.readline()              # the other process has tried to open the stick
    runs = 0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        dev.run(h, xs)
        runs += 1
    dev.close()
    print("runs", runs, flush=True)
""")


def test_second_process_gets_busy_while_the_first_keeps_running():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(shared_model(DWN1_MODEL))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "ready"
        start = time.monotonic()
        with pytest.raises(DeviceBusyError) as info:
            open_device(backend=SimulatedBackend(firmware_loaded=True))
        assert time.monotonic() - start < 1.0
        assert info.value.holder_pid == holder.pid and str(holder.pid) in str(info.value)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        out, _ = holder.communicate(timeout=20)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 0
    assert int(out.split()[-1]) > 0
    with open_device(backend=SimulatedBackend(firmware_loaded=True)):   # free again
        pass
