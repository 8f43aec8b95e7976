"""Soak: thousands of inferences on a misbehaving simulated stick, never a wrong answer.

A session on ``target="sim"`` runs a small model (one 1x1 convolution, an Edge
TPU segment) through the real USB driver on a :class:`SimulatedBackend`
(``time_scale=0``: no simulated device time) while faults are injected from a
seeded RNG: timeouts, stalls, disconnects, fatal-error interrupts, slow
re-enumeration after the firmware download, and the two behaviours that
follow public reports (docs/usb.md, "Sticks that misbehave"): a stick that is
enumerated but not ready for a while, and a wedged stick that answers nothing
until it is replugged.  After an error the loop does what the error message
tells a user: ``session.reset()``, or unplug and replug the stick (simulated,
coming back in bootloader or running mode) and then ``session.reset()``.

Every operation (a run, a reset) must end in either
- a correct result: outputs bit-identical to those of a session that never saw
  a fault (the simulated Edge TPU is bit-exact), or
- a typed coralrt error (``CoralRTError``) within its time bound,
never in a wrong output, an untyped exception, a hang (a watchdog,
``faulthandler.dump_traceback_later``, ends the process with a traceback past
``WATCHDOG`` seconds) or a dead process: the loop runs in a child process,
and the test checks that it exits normally and reports its counts.

``make test`` runs a short soak (a few hundred inferences); ``CORALRT_SOAK=1``
(``make soak``) runs the long one (``CORALRT_SOAK_INFERENCES``, default 5,000).
Both print the counts: inferences, faults injected and fired by kind, correct
results, typed errors by class (runs and resets), and the longest time to an
error.

Run by hand: ``python tests/test_soak.py --inferences 1000 --seed 3``.
"""

from __future__ import annotations

import argparse
import errno as _errno
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SOAK = os.environ.get("CORALRT_SOAK", "") not in ("", "0")
LONG_INFERENCES = int(os.environ.get("CORALRT_SOAK_INFERENCES", "5000"))

# The driver's bounds (seconds), small so that the soak is fast; the simulated
# stick waits at most MAX_WAIT for a timeout (capped, as its max_wait says).
TIMEOUT = 0.1               # each transfer
READY = 0.3                 # an enumerated stick must answer within this
REENUMERATION = 0.4         # the stick must come back after a firmware download / reset
MAX_WAIT = 0.02
FIRMWARE = b"\x02" * 300
# Time bounds for an operation that ends in an error.  A run: the transfer's
# timeout, the interrupt poll (0.05 s) and one short register read, plus
# scheduling slack.  A reset: port resets, the wait for re-enumeration, a
# firmware download (with its DFU recovery), the wait for readiness.
RUN_BOUND = TIMEOUT + 0.05 + TIMEOUT + 1.0
RESET_BOUND = 4 * REENUMERATION + READY + 20 * TIMEOUT + 2.0
WATCHDOG = 60.0             # past this an operation is a hang: the child dies loudly

TRANSFER_FAULTS = ("timeout", "stall", "disconnect", "fatal", "wedge")
WINDOW_FAULTS = ("slow_reenumeration", "not_ready")
# Weights of the fault kinds (the transfer faults fire on the transfer `after`
# more transfers from now, so also during resets and firmware downloads).
WEIGHTS = {"timeout": 3, "stall": 3, "disconnect": 2, "fatal": 2, "wedge": 2,
           "slow_reenumeration": 2, "not_ready": 3}


def soak(inferences: int, seed: int, rate: float = 0.2) -> dict:
    """Run the soak loop in this process; the counts (see the module docstring)."""
    import faulthandler
    import random

    import numpy as np

    sys.path.insert(0, str(HERE))
    from support.models import conv_chain

    from coralrt import InferenceSession
    from coralrt._compile.cache import CompileCache
    from coralrt.errors import CoralRTError, DeviceLostError, DeviceWedgedError
    from coralrt.testing import SimulatedBackend
    from coralrt._usb.driver import UsbEdgeTpu

    rng = random.Random(seed)
    model = conv_chain(1, 16, 8, seed)
    opts = dict(target="sim", cache=CompileCache(enabled=False))
    feed_rng = np.random.default_rng(seed)
    with InferenceSession(model, **opts) as ref:      # never sees a fault: the yardstick
        feeds = [{t.name: feed_rng.integers(0, 256, t.shape, np.uint8)
                  for t in ref.get_inputs()} for _ in range(8)]
        want = [ref.run(f) for f in feeds]
    assert len({b"".join(v.tobytes() for v in w.values()) for w in want}) == len(feeds)

    backend = SimulatedBackend(firmware_loaded=True, time_scale=0.0, max_wait=MAX_WAIT,
                               lock_scope="process", transcript_limit=64)
    stick = backend.devices[0]
    device = UsbEdgeTpu(None, backend, timeout=TIMEOUT, firmware=FIRMWARE,
                        ready_timeout=READY, reenumeration_timeout=REENUMERATION)
    device.open()
    session = InferenceSession(model, device=device, **opts)

    c = {"inferences": 0, "correct": 0, "wrong": 0, "injected": Counter(),
         "run_errors": Counter(), "reset_errors": Counter(), "untyped": Counter(),
         "late": [], "replugs": 0, "resets": 0, "unrecovered": 0,
         "max_seconds_to_error": {"run": 0.0, "reset": 0.0}}

    def timed(what: str, fn):
        """(value, error, seconds) of fn() under the watchdog; untyped errors re-raised."""
        faulthandler.dump_traceback_later(WATCHDOG, exit=True)
        start = time.monotonic()
        try:
            return fn(), None, time.monotonic() - start
        except CoralRTError as e:
            took = time.monotonic() - start
            bound = RUN_BOUND if what == "run" else RESET_BOUND
            c["max_seconds_to_error"][what] = max(c["max_seconds_to_error"][what], took)
            if took > bound:
                c["late"].append(f"{what}: {type(e).__name__} after {took:.2f} s > {bound:.2f}")
            (c["run_errors"] if what == "run" else c["reset_errors"])[type(e).__name__] += 1
            return None, e, took
        except Exception as e:          # noqa: BLE001 - counted: the test fails on any
            c["untyped"][f"{what}: {type(e).__name__}: {e}"] += 1
            return None, e, time.monotonic() - start
        finally:
            faulthandler.cancel_dump_traceback_later()

    def replug():
        c["replugs"] += 1
        backend.replug(0, mode=rng.choice(["bootloader", "running"]))

    def recover(error) -> None:
        """What the messages tell a user to do, until a reset works (bounded)."""
        if isinstance(error, DeviceWedgedError) or (
                isinstance(error, DeviceLostError) and error.errno == _errno.ENODEV):
            replug()
        for _ in range(6):
            c["resets"] += 1
            _, e, _ = timed("reset", session.reset)
            if e is None:
                return
            if "replug" in str(e) or not stick.present:
                replug()
        c["unrecovered"] += 1

    def inject() -> None:
        kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        c["injected"][kind] += 1
        if kind in TRANSFER_FAULTS:
            backend.inject(kind, after=rng.randrange(0, 12))
            return
        # A window fault opens at the next (re-)enumeration: make one happen, by a
        # replug into bootloader mode (firmware download) or a port reset.
        long_one = rng.random() < 0.1         # past the driver's bound: a typed error
        bound = READY if kind == "not_ready" else REENUMERATION
        seconds = bound + rng.uniform(0.05, 0.2) if long_one else rng.uniform(0.0, bound / 2)
        extra = {"error": rng.choice(["io", "pipe", "timeout"])} if kind == "not_ready" else {}
        backend.inject(kind, seconds=seconds, **extra)
        if kind == "slow_reenumeration" or rng.random() < 0.5:
            c["replugs"] += 1
            backend.replug(0, mode="bootloader")
        c["resets"] += 1
        _, e, _ = timed("reset", session.reset)
        if e is not None:
            if long_one:        # let the window pass, as a user waiting would
                time.sleep(max(0.0, stick.not_ready_until - time.monotonic()))
            recover(e)

    for i in range(inferences):
        if rng.random() < rate:
            inject()
        k = i % len(feeds)
        got, e, _ = timed("run", lambda: session.run(feeds[k]))
        c["inferences"] += 1
        if e is None:
            same = got.keys() == want[k].keys() and all(
                np.array_equal(got[n], want[k][n]) for n in got)
            c["correct" if same else "wrong"] += 1
        else:
            recover(e)
    session.close()
    device.close()
    fired = Counter(c["injected"])
    for f in stick.faults:             # armed, never reached a transfer / enumeration
        fired[f.kind] -= 1
    c["fired"] = fired
    c["pending_at_end"] = len(stick.faults)
    return {k: (dict(v) if isinstance(v, Counter) else v) for k, v in c.items()}


def run_child(inferences: int, seed: int, rate: float, tmp: Path) -> dict:
    """The soak in a child process (a crash or a hang there cannot take pytest down)."""
    env = dict(os.environ, CORALRT_RUNTIME_DIR=str(tmp / "run"),
               XDG_CACHE_HOME=str(tmp / "cache"), XDG_DATA_HOME=str(tmp / "data"),
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(Path(__file__)), "--inferences", str(inferences),
                           "--seed", str(seed), "--rate", str(rate)],
                          capture_output=True, text=True, env=env,
                          timeout=WATCHDOG + inferences * 2.0)
    assert proc.returncode == 0, (f"the soak process died (exit {proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("SOAK-RESULT ")][-1]
    counts = json.loads(line[len("SOAK-RESULT "):])
    counts["wall_seconds"] = round(time.monotonic() - start, 1)
    return counts


def report(counts: dict) -> str:
    fired = counts["fired"]
    lines = [
        f"soak: {counts['inferences']} inferences, {counts['correct']} correct, "
        f"{counts['wrong']} wrong, {sum(counts['run_errors'].values())} typed run errors, "
        f"{counts['resets']} resets ({sum(counts['reset_errors'].values())} typed errors), "
        f"{counts['replugs']} replugs, {counts['wall_seconds']} s",
        "  faults injected (fired): " + ", ".join(
            f"{k} {v} ({fired.get(k, 0)})" for k, v in sorted(counts["injected"].items())),
        "  run errors: " + (", ".join(f"{k} {v}" for k, v in
                                      sorted(counts["run_errors"].items())) or "none"),
        "  reset errors: " + (", ".join(f"{k} {v}" for k, v in
                                        sorted(counts["reset_errors"].items())) or "none"),
        f"  max time to error: run {counts['max_seconds_to_error']['run']:.3f} s "
        f"(bound {RUN_BOUND:.2f}), reset {counts['max_seconds_to_error']['reset']:.3f} s "
        f"(bound {RESET_BOUND:.2f})",
        f"  untyped errors: {sum(counts['untyped'].values())}, late errors: "
        f"{len(counts['late'])}, unrecovered: {counts['unrecovered']}",
    ]
    return "\n".join(lines)


def check(counts: dict, inferences: int) -> None:
    assert counts["inferences"] == inferences
    assert counts["wrong"] == 0, counts
    assert not counts["untyped"], counts["untyped"]
    assert not counts["late"], counts["late"]
    assert counts["unrecovered"] == 0, counts
    assert counts["correct"] + sum(counts["run_errors"].values()) == inferences
    # The soak means something only if the faults happened and most runs still worked.
    assert counts["correct"] >= inferences // 2
    assert all(counts["injected"].get(k, 0) for k in WEIGHTS), counts["injected"]
    assert counts["reset_errors"].get("DeviceNotReadyError", 0) \
        + counts["run_errors"].get("DeviceWedgedError", 0) > 0


def test_soak_short(tmp_path):
    n = 500
    counts = run_child(n, seed=1, rate=0.25, tmp=tmp_path)
    print("\n" + report(counts))
    check(counts, n)


@pytest.mark.skipif(not SOAK, reason="soak test: set CORALRT_SOAK=1 (make soak) to run it")
def test_soak_long(tmp_path):
    counts = run_child(LONG_INFERENCES, seed=2026, rate=0.2, tmp=tmp_path)
    print("\n" + report(counts))
    print("SOAK-COUNTS " + json.dumps(counts, sort_keys=True))
    check(counts, LONG_INFERENCES)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inferences", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.2)
    args = parser.parse_args()
    import logging
    logging.basicConfig(level=logging.CRITICAL)
    result = soak(args.inferences, args.seed, args.rate)
    print("SOAK-RESULT " + json.dumps(result, sort_keys=True), flush=True)
