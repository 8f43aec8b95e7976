"""What goes on the wire for one run: coralrt segments and DWN1 executables.

An :class:`Exchange` lives from an ``open`` of :class:`~coralrt._usb.driver.UsbEdgeTpu`
to its close (or reset): it holds the :class:`~coralrt._usb.framing.Framer` and
the host's record of what the stick holds, the segments loaded on it and the
parameter-caching programs uploaded (with their token); a new one starts
empty, as a reset stick does.  A coralrt segment is uploaded on its first run
(answered by an event), then each run sends the RUN record and the inputs and
reads the outputs and a completion event; a stick that no longer holds the
segment refuses the run, and the segment is loaded again once.  A DWN1
executable follows its DMA hints in order, after the parameter-caching
executable when its token is not cached yet.

When the stick answers a whole request with the reason it cannot run it, the
exchange raises :class:`Answered` (host and stick still in step); every other
failure is a DeviceError, or whatever escaped a transfer.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from coralrt.errors import DeviceError, InferenceError, InputError, ModelError
from coralrt._usb import constants as C
from coralrt._usb.framing import Framer
from coralrt._usb.handles import ExecutableHandle, SegmentHandle

__all__ = ["Exchange", "Answered", "segment_inputs", "executable_inputs"]

log = logging.getLogger("coralrt.usb")


class Answered(Exception):
    """The stick answered the whole request and said why it could not run it
    (``error``: a ModelError or InferenceError); host and stick are in step."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def segment_inputs(h: SegmentHandle, inputs) -> list[np.ndarray]:
    """``inputs`` as the contiguous arrays ``h`` takes (InputError if they do not fit)."""
    if len(inputs) != len(h.inputs):
        raise InputError(f"the segment takes {len(h.inputs)} inputs, got {len(inputs)}")
    arrays = []
    for i, (value, (shape, dtype)) in enumerate(zip(inputs, h.inputs)):
        arr = np.ascontiguousarray(value, dtype=dtype)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise InputError(f"segment input {i} has shape {list(arr.shape)}, expected "
                             f"{list(shape)}")
        arrays.append(arr)
    return arrays


def executable_inputs(h: ExecutableHandle, inputs) -> dict:
    """``inputs`` staged for ``h``'s input layers, by layer name."""
    exe = h.exe
    if len(inputs) != len(exe.inputs):
        raise InputError(f"the executable takes {len(exe.inputs)} inputs "
                         f"({', '.join(x.name for x in exe.inputs)}), got {len(inputs)}")
    return {s.layer.name: s.stage(v) for s, v in zip(h.stagers, inputs)}


class Exchange:
    """The requests of one open stick (``path``: its name in messages)."""

    def __init__(self, framer: Framer, path: str):
        self.framer = framer
        self.path = path
        self._on_device: set = set()         # segment keys the stick holds
        self._cached_token: int | None = None
        self._cached: set = set()            # parameter-caching programs uploaded

    def _reason(self, length: int) -> str:
        """The UTF-8 reason that follows an error event with a nonzero length."""
        buf = np.empty(length, np.uint8)
        self.framer.read_output(buf, "the stick's reason")
        return buf.tobytes().decode("utf-8", "replace")

    # -- coralrt segments ---------------------------------------------------------------
    def _upload_segment(self, h: SegmentHandle) -> float:
        framer = self.framer
        start = time.perf_counter()
        framer.send(C.TAG_PARAMETERS, h.data)
        _, length, tag = framer.read_event("segment load event")
        if tag == C.TAG_ERROR and length:
            raise Answered(ModelError(
                f"{self.path}: the stick cannot load this Edge TPU segment: "
                f"{self._reason(length)}"))
        if tag != C.TAG_INTERRUPT0:
            raise DeviceError(f"{self.path}: the stick refused the segment (event tag {tag:#x})",
                              path=self.path)
        self._on_device.add(h.key)
        return time.perf_counter() - start

    def run_segment(self, h: SegmentHandle, arrays):
        """(parameter upload seconds, outputs) of one run of ``h`` on ``arrays``."""
        framer = self.framer
        upload = 0.0
        for attempt in range(2):
            if h.key not in self._on_device:
                upload += self._upload_segment(h)
            framer.send_prepared(C.TAG_INSTRUCTIONS, h.run_parts, 16)
            for arr in arrays:
                framer.send(C.TAG_INPUT, arr)
            outputs = []
            refused = False
            for shape, dtype in h.outputs:
                buf = np.empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, np.uint8)
                if not framer.read_output(buf, "segment output", allow_refusal=True):
                    refused = True
                    break
                outputs.append(buf.view(dtype.newbyteorder("<")).reshape(shape))
            _, length, tag = framer.read_event("segment completion event")
            if tag == C.TAG_INTERRUPT0 and not refused:
                return upload, outputs
            if tag == C.TAG_ERROR and length:   # it ran, and failed on these inputs
                raise Answered(InferenceError(
                    f"{self.path}: the Edge TPU segment failed while running on these "
                    f"inputs: {self._reason(length)}"))
            if tag != C.TAG_ERROR or attempt:
                raise DeviceError(f"{self.path}: segment run failed (event tag {tag:#x})",
                                  path=self.path)
            log.info("%s: the stick does not hold the segment; loading it again", self.path)
            self._on_device.discard(h.key)
        raise AssertionError("unreachable")

    # -- DWN1 executables ---------------------------------------------------------------
    def run_executable(self, h: ExecutableHandle, staged: dict):
        """(parameter upload seconds, outputs) of one run of ``h`` on ``staged``."""
        exe = h.exe
        token = exe.caching_token
        if not token or token != self._cached_token:
            self._cached_token = None
            self._cached.clear()
        upload = 0.0
        if h.cache is not None and h.key not in self._cached:
            start = time.perf_counter()
            self._follow_hints(h, h.cache, {}, {})
            self._cached_token = token
            self._cached.add(h.key)
            upload = time.perf_counter() - start
        self._follow_hints(h, exe, staged, h.raw)
        return upload, [d.decode(h.raw[d.layer.name]) for d in h.decoders]

    def _follow_hints(self, h: ExecutableHandle, exe, staged, raw) -> None:
        framer = self.framer
        parts = h.parts[id(exe)]
        ended = False
        for hint in exe.dma_hints:
            kind = hint.kind
            ended = kind == "interrupt"
            if kind == "instruction":
                framer.send_prepared(C.TAG_INSTRUCTIONS, parts[hint.chunk], hint.size)
            elif kind == "input":
                framer.send(C.TAG_INPUT, staged[hint.name][hint.offset:hint.offset + hint.size])
            elif kind == "parameter":
                framer.send(C.TAG_PARAMETERS,
                            exe.parameters[hint.offset:hint.offset + hint.size])
            elif kind == "output":
                framer.read_output(raw[hint.name][hint.offset:hint.offset + hint.size],
                                   f"output {hint.name!r}")
            elif kind == "scratch":
                if hint.direction == "outfeed":
                    framer.read_output(np.empty(hint.size, np.uint8), "scratch")
                else:
                    framer.send(C.TAG_INPUT, np.zeros(hint.size, np.uint8))
            elif kind == "interrupt":
                self._expect_event(C.TAG_INTERRUPT0 + (hint.interrupt or 0), exe.type)
        if not ended:
            self._expect_event(C.TAG_INTERRUPT0, exe.type)

    def _expect_event(self, want: int, what: str) -> None:
        _, _, tag = self.framer.read_event(f"{what} completion event")
        if tag == C.TAG_ERROR:
            raise DeviceError(f"{self.path}: {what}: the stick refused the request (error "
                              f"event, tag 0xf)", path=self.path)
        if tag != want:
            raise DeviceError(f"{self.path}: {what}: expected an event with tag {want}, got "
                              f"{tag:#x}", path=self.path)
