"""Google's libedgetpu and coralrt's driver on the same simulated stick, side by side.

:func:`libedgetpu_session` runs one compiled model through LiteRT with the
vendored libedgetpu (``litert_child.py`` in a child process, talking to a
:class:`~usbshim.server.StickServer` through the libusb shim) and returns what
the stick saw; :func:`coralrt_session` runs the same model through coralrt's
driver, in this process, on a stick of the same kind, with the same inputs.
:func:`streams`, :func:`register_phases` and :func:`instruction_differences`
cut the two transcripts into what the tests compare.

libedgetpu's stick starts in bootloader mode (it downloads the firmware it
carries), coralrt's in running mode; both are in the DWN1 test mode with the model's
packages known (``support.sim.accept_dwn1``) and with ``record_payloads``, so
each host -> device stream's bytes are in the transcript.  The stick answers
placeholder bytes computed from the request's inputs (coralrt/_sim/stick/
dwn1_requests.py), the same for both hosts when they send the same inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coralrt.testing import SimulatedBackend
from coralrt._sim.stick.dwn1_requests import instruction_mask
from usbshim.server import StickServer

HERE = Path(__file__).resolve().parent
VENDOR = HERE.parents[2] / "shared" / "vendor" / "libedgetpu"
#: The vendored builds, with the clock variant coralrt must bring up to match each.
BUILDS = {"direct": "max", "throttled": "std"}
#: The LiteRT whose struct layouts the vendored builds were compiled against.
LITERT_VERSION = "2.3.0"
#: Longest a child may take for one model: download, open, first and warm run, close.
MODEL_SECONDS = 20.0


def library(build: str) -> Path:
    return VENDOR / build / "libedgetpu.so.1"


@dataclass
class Session:
    """What one host did with one model on one stick."""

    transcript: list
    outputs: dict = field(default_factory=dict)     # run ("first"/"warm") -> [arrays]
    steps: list = field(default_factory=list)       # the child's JSON lines (libedgetpu)
    returncode: int = 0
    stderr: str = ""
    seconds: float = 0.0
    failures: list = field(default_factory=list)    # the server's
    log: list = field(default_factory=list)         # the shim's and server's log lines

    @property
    def refused(self) -> str | None:
        return next((s["error"] for s in self.steps if s["step"] == "refused"), None)


def test_backend(model: Path, *, firmware_loaded: bool = False) -> SimulatedBackend:
    """A stick (in bootloader mode unless ``firmware_loaded``), in DWN1 test mode for
    ``model``, with payloads recorded."""
    from support.sim import accept_dwn1
    backend = accept_dwn1(SimulatedBackend(firmware_loaded=firmware_loaded,
                                           transcript_limit=None, lock_scope="process"),
                          [model])
    backend.record_payloads = True
    return backend


def libedgetpu_session(build: str, model: Path, shim: Path, work: Path) -> Session:
    """``model`` through LiteRT + libedgetpu ``build`` (first and warm run) in a child."""
    backend = test_backend(model)
    out = work / f"libedgetpu-{build}-{model.stem}"
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    log = work / f"usb-{build}-{model.stem}.jsonl"
    with StickServer(backend, log_path=log, shim=shim) as server:
        try:
            done = subprocess.run(
                [sys.executable, str(HERE / "litert_child.py"), str(library(build)), str(out),
                 str(model)], env=server.env(), timeout=MODEL_SECONDS, capture_output=True,
                text=True)
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as e:
            code, stdout = "timeout", (e.stdout or b"").decode(errors="replace")
            stderr = (e.stderr or b"").decode(errors="replace")
        failures = list(server.failures)
    session = Session(list(backend.transcript), returncode=code, stderr=stderr,
                      seconds=time.monotonic() - start, failures=failures)
    session.steps = [json.loads(line) for line in stdout.splitlines()
                     if line.startswith("{")]
    if log.is_file():
        session.log = [json.loads(line) for line in log.read_text().splitlines()]
    for run in ("first", "warm"):
        files = sorted(out.glob(f"0_{run}_*.npy"), key=lambda p: int(p.stem.split("_")[-1]))
        if files:
            session.outputs[run] = [np.load(p) for p in files]
    return session


def coralrt_session(clock: str, model: Path) -> Session:
    """``model`` through coralrt's driver (first and warm run), same inputs as the child."""
    from coralrt import InferenceSession, open_device
    from usbshim.litert_child import inputs

    # Running already: coralrt does not ship Google's firmware image (libedgetpu carries
    # it); the open's port reset brings the chip to its power-on state all the same.
    backend = test_backend(model, firmware_loaded=True)
    start = time.monotonic()
    stick = open_device(None, backend, clock=clock)
    session = Session([])
    try:
        sess = InferenceSession(model, target="coral", device=stick)
        details = [{"shape": i.shape, "dtype": i.dtype} for i in sess.get_inputs()]
        feed = inputs(details)
        for run in ("first", "warm"):
            session.outputs[run] = list(sess.run(feed).values())
        sess.close()
    finally:
        stick.close()
    session.transcript = list(backend.transcript)
    session.seconds = time.monotonic() - start
    return session


# -- cutting transcripts ------------------------------------------------------------------

def streams(transcript) -> list[tuple[int, int, bytes]]:
    """(tag, length, payload) of every host -> device stream, in order."""
    return [(e["tag"], e["length"], bytes(e.get("data") or b"")) for e in transcript
            if e["op"] == "bulk_out"]


def reads(transcript) -> tuple[int, int]:
    """(bytes read on EP 0x81, event records read on EP 0x82) in the whole session.
    (Per request would depend on timing: libedgetpu sends the next request before it
    has read the last one's event.)"""
    out = [e for e in transcript if e["op"] == "bulk_in" and not e.get("error")]
    return (sum(e["length"] for e in out if e.get("ep") == 0x81),
            sum(1 for e in out if e.get("ep") == 0x82))


def register_phases(transcript) -> tuple[list, list]:
    """(bring-up, teardown): the (op, register, value) of the register accesses of the
    last open before the first bulk stream, and of those after the last one."""
    regs = [(i, (e["op"], e["register"], e["value"])) for i, e in enumerate(transcript)
            if e["op"] in ("read", "write")]
    bulk = [i for i, e in enumerate(transcript) if e["op"] == "bulk_out"]
    claim = max(i for i, e in enumerate(transcript) if e["op"] == "claim_interface")
    first, last = (bulk[0], bulk[-1]) if bulk else (len(transcript), len(transcript))
    return ([r for i, r in regs if claim < i < first], [r for i, r in regs if i > last])


def instruction_differences(ours: bytes, theirs: bytes, offset_bits) -> list[int]:
    """Byte positions where the two instruction streams differ outside the bits the
    chunk's FieldOffset entries cover (``offset_bits``)."""
    if len(ours) != len(theirs):
        return [-1]
    a = np.frombuffer(ours, np.uint8)
    b = np.frombuffer(theirs, np.uint8)
    diff = a ^ b
    for byte, bits in instruction_mask(len(ours), offset_bits).items():
        diff[byte] &= ~bits & 0xFF
    return [int(i) for i in np.flatnonzero(diff)]


def field_offset_bits(model: Path) -> dict[bytes, list[int]]:
    """{instruction chunk bytes: its FieldOffset bit offsets} for every chunk of every
    executable of ``model``'s packages."""
    from coralrt._formats.dwn1 import parse_package
    from support.sim import packages_of

    out: dict[bytes, list[int]] = {}
    for package in packages_of(model):
        for exe in parse_package(package).executables:
            for chunk, offsets in zip(exe.instructions, exe.field_offsets):
                out[bytes(chunk)] = [f.offset_bit for f in offsets]
    return out


def compiled_models(shared: Path) -> list[Path]:
    """The shared compiled models, and those of ``CORALRT_EXTRA_MODELS`` folders."""
    models = sorted((shared / "edgetpu").glob("*_edgetpu.tflite"))
    for folder in filter(None, os.environ.get("CORALRT_EXTRA_MODELS", "").split(os.pathsep)):
        models += sorted(Path(folder).rglob("*_edgetpu.tflite"))
    return models
