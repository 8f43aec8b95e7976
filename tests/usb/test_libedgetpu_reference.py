"""Google's libedgetpu, unmodified, as the reference client of the simulated stick.

The vendored libedgetpu (``shared/vendor/libedgetpu``, HEAD e35aed1, its direct
and throttled builds) runs in a child process through LiteRT's delegate API,
with libedgetpu's defaults (no ``USB_*`` or ``CORALRT_COMPAT`` variables), and
reaches a simulated stick through the test libusb (tests/usbshim).  For every
compiled model of ``shared/models/edgetpu`` (and of ``CORALRT_EXTRA_MODELS``):
firmware download, open, first and warm run, close, each model in a process of
its own within 20 s.  coralrt's driver then runs the same model on a stick of
the same kind with the same inputs, and the two are compared: the streams
(order, tags, lengths), the parameter and input bytes, the instruction bytes
outside the ``FieldOffset`` fields, what each request read back, the outputs,
and the register accesses of bring-up and teardown.  Every difference is
either listed in :data:`EXPLAINED` with its reason (docs/usb.md) or fails.

The simulated stick executes nothing: in its DWN1 test mode it answers
placeholder bytes computed from the request's inputs (the same for both hosts
when they send the same inputs).  What this shows is the protocol as Google's
runtime speaks it, not the chip's computation (docs/hardware-validation.md).

Prerequisites: a C compiler (the shim), the vendored library and
``ai-edge-litert==2.3.0`` (the ABI the library was built for).  Without LiteRT,
or with another version, the module skips with the reason; under ``CI=true`` a
missing compiler or library fails.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

import numpy as np
import pytest
from conftest import MODELS_DIR

from usbshim import reference as R
from usbshim.server import ShimBuildError, build_shim, find_compiler

pytestmark = pytest.mark.needs_litert("libedgetpu runs inside LiteRT's interpreter")

#: Register accesses one side makes and the other does not, each with its reason.
EXPLAINED = {
    ("coralrt", "read", 0x4C068): "coralrt reads fatal_err_int_status once after the "
                                  "bring-up; libedgetpu keeps an interrupt read queued instead",
}
#: Shared models libedgetpu refuses, with the reason it gives (and coralrt gives too).
REFUSED = {"keras_lstm_mnist_ptq_edgetpu": "must have fully deterministic DMA hints"}


def _missing(why: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{why} (CI=true: the main suite must run these tests)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def shim():
    try:
        version = metadata.version("ai-edge-litert")
    except metadata.PackageNotFoundError:
        pytest.skip("ai-edge-litert is not installed (the vendored libedgetpu runs in it)")
    if version != R.LITERT_VERSION:
        pytest.skip(f"ai-edge-litert {version}: the vendored libedgetpu was built for the "
                    f"struct layouts of {R.LITERT_VERSION} and may crash in another")
    if not MODELS_DIR.is_dir():
        pytest.skip(f"{MODELS_DIR} is absent")
    for build in R.BUILDS:
        if not R.library(build).is_file():
            _missing(f"{R.library(build)} is absent")
    if find_compiler() is None:
        _missing("no C compiler on PATH ($CC, cc, gcc, clang): the libusb shim cannot be "
                 "built")
    try:
        return build_shim()
    except ShimBuildError as e:
        pytest.fail(str(e))


MODELS = R.compiled_models(MODELS_DIR) if MODELS_DIR.is_dir() else []
CASES = [pytest.param(b, m, id=f"{b}-{m.stem}") for b in R.BUILDS for m in MODELS]


@pytest.fixture(scope="module")
def sessions(shim, tmp_path_factory):
    """(build, model) -> (libedgetpu's Session, coralrt's Session or its error).

    All are made on first use, two at a time: a libedgetpu child spends most of its
    time in libedgetpu's fixed sleeps, during which the other pair runs."""
    work = tmp_path_factory.mktemp("libedgetpu")
    cache: dict = {}

    def pair(key):
        build, model = key
        theirs = R.libedgetpu_session(build, model, shim, work)
        try:
            ours = R.coralrt_session(R.BUILDS[build], model)
        except Exception as e:              # compared with libedgetpu's refusal below
            ours = e
        return theirs, ours

    def get(build, model):
        if not cache:
            keys = [(b, m) for b in R.BUILDS for m in MODELS]
            with ThreadPoolExecutor(max_workers=2) as pool:
                cache.update(zip(keys, pool.map(pair, keys)))
        if (build, model) not in cache:
            cache[(build, model)] = pair((build, model))
        return cache[(build, model)]
    return get


@pytest.mark.parametrize("build, model", CASES)
def test_libedgetpu_runs_every_compiled_model(sessions, build, model):
    theirs, ours = sessions(build, model)
    where = f"libedgetpu {build} on {model.name}"
    assert theirs.returncode == 0, f"{where}: exit {theirs.returncode}\n{theirs.stderr[-3000:]}"
    assert theirs.seconds < R.MODEL_SECONDS
    assert theirs.failures == []
    steps = [s["step"] for s in theirs.steps]
    assert steps[0] == "delegate" and steps[-1] == "closed"
    ops = [e["op"] for e in theirs.transcript]
    assert "dfu_dnload" in ops and "reenumerate" in ops         # it downloaded its firmware
    assert "fatal" not in ops                                    # the stick saw no stray
    # Through the shim: the reset after the download answers NOT_FOUND (the stick
    # re-enumerates), libedgetpu lists the devices again and opens it there; its
    # asynchronous transfers complete on every endpoint, and after a run its queued
    # reads are cancelled when it closes.
    calls = [(x["call"], x["status"]) for x in theirs.log if x["side"] == "shim"]
    reset = calls.index(("libusb_reset_device", "LIBUSB_ERROR_NOT_FOUND"))
    assert ("libusb_open", "LIBUSB_SUCCESS") in calls[reset:]
    done = {(x["ep"], x["status"]) for x in theirs.log
            if x["side"] == "shim" and x["call"] == "callback"}
    if theirs.refused is None:
        assert {(0x01, "LIBUSB_TRANSFER_COMPLETED"), (0x81, "LIBUSB_TRANSFER_COMPLETED"),
                (0x82, "LIBUSB_TRANSFER_COMPLETED"), (0x81, "LIBUSB_TRANSFER_CANCELLED")} <= done
        assert steps == ["delegate", "first", "warm", "closed"]
        assert ops.count("dwn1_request") >= 3                    # caching, first, warm
        assert not isinstance(ours, Exception), f"coralrt failed where libedgetpu ran: {ours}"
    else:
        # Refused cleanly: the process stays up and closes the stick; coralrt refuses
        # it too, for the same reason.
        assert model.stem in REFUSED or MODELS_DIR not in model.parents, theirs.refused
        reason = REFUSED.get(model.stem, "deterministic DMA hints")
        assert reason in theirs.refused
        assert isinstance(ours, Exception) and "deterministic DMA hints" in str(ours)


def _unexplained(side: str, ops, other) -> list:
    extra = list(ops)
    for op in other:
        if op in extra:
            extra.remove(op)
    return [op for op in extra if (side, op[0], op[1]) not in EXPLAINED]


def _diff(theirs, ours) -> str:
    def fmt(r):
        return f"{r[0]} {r[1]:#x} {r[2]:#x}"
    return "\n".join(difflib.unified_diff([fmt(r) for r in theirs], [fmt(r) for r in ours],
                                          "libedgetpu", "coralrt", lineterm="", n=2))


@pytest.mark.parametrize("build, model", CASES)
def test_coralrt_driver_sends_what_libedgetpu_sends(sessions, build, model):
    theirs, ours = sessions(build, model)
    if theirs.refused is not None:
        pytest.skip(f"libedgetpu refuses {model.name}: {theirs.refused}")
    # Streams: same order, tags and lengths; parameters and inputs byte for byte;
    # instructions byte for byte outside the FieldOffset fields.
    a, b = R.streams(theirs.transcript), R.streams(ours.transcript)
    assert [(t, n) for t, n, _ in b] == [(t, n) for t, n, _ in a]
    offsets = R.field_offset_bits(model)
    patched = 0
    for i, ((tag, _, data_theirs), (_, _, data_ours)) in enumerate(zip(a, b)):
        if tag == 0:
            assert data_ours in offsets, f"stream {i}: coralrt sent instructions not in the file"
            assert R.instruction_differences(data_ours, data_theirs, offsets[data_ours]) == []
            patched += data_ours != data_theirs
        else:
            assert data_ours == data_theirs, f"stream {i} (tag {tag}) differs"
    assert patched or not any(offsets.values())    # libedgetpu did patch its addresses
    # What was read back: output bytes on EP 0x81 and events on EP 0x82, one per request.
    requests = sum(1 for e in theirs.transcript if e["op"] == "dwn1_request")
    assert R.reads(ours.transcript) == R.reads(theirs.transcript)
    assert R.reads(theirs.transcript)[1] == requests
    # The outputs: the same placeholder bytes through Google's and coralrt's decoding.
    for run in ("first", "warm"):
        assert len(ours.outputs[run]) == len(theirs.outputs[run])
        for x, y in zip(theirs.outputs[run], ours.outputs[run]):
            assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("build", list(R.BUILDS))
def test_bring_up_and_teardown_are_libedgetpu_s(sessions, build):
    model = next(m for m in MODELS if m.stem not in REFUSED)
    theirs, ours = sessions(build, model)
    (up_theirs, down_theirs), (up_ours, down_ours) = (R.register_phases(theirs.transcript),
                                                      R.register_phases(ours.transcript))
    for phase, t, o in (("bring-up", up_theirs, up_ours), ("teardown", down_theirs, down_ours)):
        bad = _unexplained("coralrt", o, t) + _unexplained("libedgetpu", t, o)
        assert not bad, f"{phase}: unexplained differences {bad}\n{_diff(t, o)}"
        explained_out = [op for op in o if ("coralrt", op[0], op[1]) not in EXPLAINED]
        assert explained_out == t, f"{phase}: same accesses, another order\n{_diff(t, o)}"
    # The clock bits: the build's, as coralrt's variant of the same name writes them.
    clocks = {v for op, reg, v in up_theirs if op == "write" and reg == 0x1A318}
    assert len(clocks) == 2 and (0x5085025C in clocks) == (build == "throttled")


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from coralrt import InferenceSession
    from usbshim.litert_child import inputs
    out = {}
    for model in sys.argv[1:]:
        try:
            sess = InferenceSession(model, target="coral", driver="libedgetpu", device="usb")
        except Exception as e:
            out[model] = {"error": f"{type(e).__name__}: {e}"}
            continue
        feed = inputs([{"shape": i.shape, "dtype": i.dtype} for i in sess.get_inputs()])
        try:
            runs = [list(sess.run(feed).values()) for _ in range(2)]
        except Exception as e:
            out[model] = {"error": f"{type(e).__name__}: {e}"}
        else:
            out[model] = {"digests": [[a.tobytes().hex() for a in r] for r in runs]}
        finally:
            sess.close()
    print(json.dumps(out))
""")


def test_driver_libedgetpu_runs_the_shared_models_on_the_simulated_stick(shim, sessions,
                                                                         tmp_path):
    """``driver="libedgetpu"`` hands each model to Google's runtime, for real."""
    from coralrt.testing import SimulatedBackend
    from support.sim import accept_dwn1
    from usbshim.server import StickServer

    runnable = [m for m in MODELS if m.stem not in REFUSED and MODELS_DIR in m.parents]
    backend = accept_dwn1(SimulatedBackend(firmware_loaded=False, transcript_limit=None,
                                           lock_scope="process"), runnable)
    with StickServer(backend, log_path=tmp_path / "usb.jsonl", shim=shim) as server:
        env = server.env()
        env["LD_LIBRARY_PATH"] += os.pathsep + str(R.library("direct").parent)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(R.HERE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        done = subprocess.run([sys.executable, "-c", CHILD, *map(str, runnable)], env=env,
                              timeout=R.MODEL_SECONDS * len(runnable), capture_output=True,
                              text=True, cwd=tmp_path)
        assert server.failures == []
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for model in runnable:
        got = results[str(model)]
        assert "error" not in got, got
        want = sessions("direct", model)[0].outputs
        assert got["digests"] == [[a.tobytes().hex() for a in want[run]]
                                  for run in ("first", "warm")], model.name
    assert "fatal" not in [e["op"] for e in backend.transcript]
