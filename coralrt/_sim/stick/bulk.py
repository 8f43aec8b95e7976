"""Bulk-endpoint side of the simulated stick: framing, coralrt segments, DWN1 streams.

Host -> device data arrives on EP 0x01 as a byte stream of 8-byte headers
(payload length u32, tag & 0xF, three zero bytes; reference §1.8) each
followed by its payload, which may come in any number of bulk writes.  The
first bytes of a payload tell what it is:

* tag 2 starting with the segment magic: LOAD of a coralrt segment.  It is
  decoded, prepared for the simulated Edge TPU's kernels, kept under its
  header bytes, and answered with an event record (address 0, the payload
  length, tag 4) on EP 0x82; when it cannot be loaded (a defect of the
  program: undecodable, or an operator the kernels refuse), with a tag 0xF
  event whose length is that of a UTF-8 reason, readable on EP 0x81 after the
  event until the host sends its next header;
* tag 0 of 16 bytes starting ``CRTSRUN\\0``: RUN record ``<8sII`` (magic,
  CRC-32 of the segment header, number of inputs).  The inputs follow as
  tag 1 streams; the outputs are queued on EP 0x81 (one chunk per output, a
  read never crosses two outputs) followed by a tag 4 event.  An unknown
  segment gets a tag 0xF event of length 0 at once, its inputs are dropped,
  and reads of EP 0x81 return zero bytes while that error event is unread.
  A run whose computation fails (a kernel rejects these inputs, as LiteRT's
  RSQRT rejects negative ones) is answered the same way, except that the
  event's length is that of a UTF-8 reason, readable as above: a defect of
  the model or its inputs, not of the stick, which stays usable;
* anything else is a raw stream (an edgetpu_compiler program: DWN1
  instructions, parameters, inputs), which the simulated Edge TPU cannot
  execute: it is recorded with its CRC-32, dropped and answered with an
  error event (tag 0xF; reads of EP 0x81 return zero bytes while it is
  unread), never with made-up outputs.  Only in the backend's test mode (see
  ``SimulatedBackend``) are raw streams requests of the DWN1 executables the
  backend was told about, played request by request by
  :mod:`coralrt._sim.stick.dwn1_requests`: an output hint's bytes become
  readable once the inputs before it arrived, one event per request follows
  its last input, a stream the programs do not expect raises the fatal error.
  The output bytes are placeholders computed from the request's inputs, NOT
  the program's outputs (the formula is in that module).
  ``record_payloads`` keeps each payload in its transcript entry ("data").

Timing-only mode (``timing_only``, for throughput benchmarks; see
``SimulatedBackend``): a loaded segment is decoded but not prepared for the
kernels, and a run computes nothing: its outputs are zeros of the segment's
output sizes, readable once the latency model's estimate of the run has
passed in full (whatever ``time_scale``), so the host waits for the device as
it would for a real stick while the simulator costs next to no host time.
Framing, transfers and events are those of a normal run.

Framing errors (a tag the host may not send, non-zero reserved header bytes,
inputs of the wrong size or out of order) raise the fatal-error interrupt;
the engine then answers nothing until a reset.  A reset also drops whatever
a request left half done (a host interrupted mid-transfer resets the stick).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import deque

import numpy as np

from coralrt._formats import segment_codec as seg_codec
from coralrt._model.types import numpy_dtype
from coralrt._sim.runner import SegmentRunner
from coralrt._sim.stick.dwn1_requests import RequestWalker
from coralrt._usb.constants import (
    EVENT, HEADER, RUN_MAGIC, RUN_RECORD, TAG_ERROR, TAG_INPUT, TAG_INSTRUCTIONS,
    TAG_INTERRUPT0, TAG_PARAMETERS,
)

__all__ = ["BulkEngine"]

log = logging.getLogger("coralrt.usb")

_PROBE = 8          # payload bytes looked at before deciding what a stream is (both magics)


class _Loaded:
    def __init__(self, segment, runner, estimate):
        self.segment, self.runner, self.estimate = segment, runner, estimate
        self.runs = 0
        self.zeros: list[bytes] | None = None     # timing-only outputs, made once


class _Stream:
    __slots__ = ("tag", "length", "received", "kind", "data", "crc", "entry", "keep",
                 "catalog", "dwn1")

    def __init__(self, tag: int, length: int, entry: dict, switches):
        self.tag, self.length, self.entry = tag, length, entry
        self.received = 0
        self.kind = None          # "load" | "run" | "input" | "drop" | "raw"
        self.data = bytearray()
        self.crc = 0
        # Test mode only: the known DWN1 programs, and the whole payload when recorded.
        self.catalog = switches.catalog if switches and switches.accept_dwn1 else None
        self.keep = bytearray() if switches and switches.record_payloads else None
        self.dwn1 = False         # a raw stream taken by the DWN1 request walker


class BulkEngine:
    """Per-stick bulk state.  The stick holds its lock around every call."""

    def __init__(self, record, on_fatal, *, latency=None, kernels=None, time_scale=1.0,
                 test_switches=lambda: None, timing_only: bool = False):
        self._record = record          # record(op, **fields) -> dict (transcript entry)
        self._on_fatal = on_fatal      # on_fatal(reason)
        # () -> the backend's test-only switches (dwn1_requests.Switches) or None
        self._test_switches = test_switches
        self.latency = latency
        # 1: data becomes readable after the estimated device time; 0: at once
        # (the estimate is still reported in last_run).
        self.time_scale = time_scale
        self.timing_only = timing_only   # test/benchmark only: wait, compute nothing
        self.kernels = dict(kernels or {})
        self.loaded: dict[bytes, _Loaded] = {}
        # The kernels prepared for the segments loaded before the last reset, kept on
        # the host side only: the stick forgets them and the host must load them
        # again, but a reload after a reset (an interrupted run, a reopen) does not
        # prepare the kernels again.
        self._spare: dict[bytes, _Loaded] = {}
        self.last_run: dict = {}
        self.reset()

    def reset(self) -> None:
        """Power-on / port reset: loaded segments, queues and stream state are lost."""
        if self.loaded:
            self._spare = dict(self.loaded)
        self.loaded.clear()
        self._by_crc: dict[int, _Loaded] = {}
        self._header = bytearray()
        self._stream: _Stream | None = None
        self._run: _Loaded | None = None
        self._inputs: list[bytes] = []
        self._drop_inputs = 0
        self.outputs: deque[memoryview] = deque()
        self.events: deque[bytes] = deque()
        self.ready_at = 0.0
        self._error_events = 0
        self._reasons: deque[bytes] = deque()   # of queued error events with a length
        self._reason: memoryview | None = None   # readable on EP 0x81 until the next header
        self.requests = RequestWalker(self.outputs.append, lambda tag: self._event(0, tag),
                                      self._record)
        self.fatal: str | None = None

    # -- host -> device ------------------------------------------------------------------

    def write(self, data: memoryview) -> None:
        pos, n = 0, len(data)
        while pos < n and self.fatal is None:
            s = self._stream
            if s is None:
                take = min(8 - len(self._header), n - pos)
                self._header += data[pos:pos + take]
                pos += take
                if len(self._header) == 8:
                    self._start(bytes(self._header))
                    self._header.clear()
                continue
            take = min(s.length - s.received, n - pos)
            self._feed(s, data[pos:pos + take])
            pos += take
            if s.received == s.length and self.fatal is None:
                self._finish(s)

    def _start(self, header: bytes) -> None:
        self._reason = None
        length, word = HEADER.unpack(header)
        tag = word & 0xFF
        entry = self._record("bulk_out", tag=tag, length=length, ep=0x01, kind=None)
        if word >> 8 or tag not in (TAG_INSTRUCTIONS, TAG_INPUT, TAG_PARAMETERS):
            self._fatal(f"bad bulk header {header.hex()} (tag {tag}; hosts send tags 0-2 "
                        f"with bytes 5..7 zero)")
            return
        s = self._stream = _Stream(tag, length, entry, self._test_switches())
        if self.requests.busy:          # a DWN1 request half walked takes every stream
            self._take_dwn1(s)
        elif self._run is not None or self._drop_inputs:
            if tag != TAG_INPUT:
                self._fatal(f"tag {tag} stream while the segment's inputs are expected")
                return
            if self._drop_inputs:
                s.kind = "drop"
            else:
                want = self._run.segment.tensors[self._run.segment.inputs[len(self._inputs)]]
                if length != want.nbytes:
                    self._fatal(f"input {len(self._inputs)} has {length} bytes; the segment "
                                f"expects {want.nbytes}")
                    return
                s.kind = "input"
            entry["kind"] = s.kind
        if length == 0 and self.fatal is None:
            self._finish(s)

    def _take_dwn1(self, s: _Stream) -> None:
        s.kind, s.dwn1 = "raw", True
        s.entry["kind"] = "raw"
        reason = self.requests.begin(s.catalog, s.tag, s.length, s.entry)
        if reason is not None:
            self._fatal(reason)
        elif s.data:                    # the bytes looked at before deciding
            s.crc = zlib.crc32(s.data)
            self.requests.feed(s.data, own=True)
            s.data = bytearray()

    def _feed(self, s: _Stream, chunk: memoryview) -> None:
        s.received += len(chunk)
        if s.keep is not None:
            s.keep += chunk
        if s.kind is None:
            s.data += chunk
            if len(s.data) >= min(_PROBE, s.length):
                self._classify(s)
        elif s.kind == "raw":
            s.crc = zlib.crc32(chunk, s.crc)
            if s.dwn1:
                self.requests.feed(chunk)
        elif s.kind != "drop":
            s.data += chunk

    def _classify(self, s: _Stream) -> None:
        head = bytes(s.data[:_PROBE])
        if s.tag == TAG_PARAMETERS and head == seg_codec.MAGIC:
            s.kind = "load"
        elif s.tag == TAG_INSTRUCTIONS and s.length == RUN_RECORD.size and head == RUN_MAGIC:
            s.kind = "run"
        elif s.catalog is not None:     # test mode: a DWN1 request starts
            self._take_dwn1(s)
            return
        else:
            s.kind = "raw"
            s.crc = zlib.crc32(s.data)
            s.data = bytearray()
        s.entry["kind"] = s.kind

    def _finish(self, s: _Stream) -> None:
        self._stream = None
        if s.kind is None:
            self._classify(s)
            if self.fatal is not None:
                return
        s.entry["complete"] = True
        if s.keep is not None:
            s.entry["data"] = bytes(s.keep)
        if s.kind == "raw":
            s.entry["crc32"] = s.crc
            self.last_run = {}          # not a segment run: no device time known
            if s.dwn1:
                reason = self.requests.end(s.entry, s.crc)
                if reason is not None:
                    self._fatal(reason)
            else:
                s.entry["refused"] = True
                if not self._error_events:
                    self._record("raw_refused", tag=s.tag, length=s.length)
                    self._event(0, TAG_ERROR)
        elif s.kind == "load":
            self._load(bytes(s.data))
        elif s.kind == "run":
            self._start_run(bytes(s.data))
        elif s.kind == "input":
            self._inputs.append(bytes(s.data))
            if len(self._inputs) == len(self._run.segment.inputs):
                self._execute()
        elif s.kind == "drop":
            self._drop_inputs -= 1

    def _event(self, length: int, tag: int) -> None:
        self.events.append(EVENT.pack(0, length, tag))
        if tag == TAG_ERROR:
            self._error_events += 1

    def _refuse(self, error: Exception) -> None:
        """A tag 0xF event whose length is that of the reason that follows it."""
        reason = (str(error) or type(error).__name__).encode("utf-8", "replace")[:4096]
        self._reasons.append(reason)
        self._event(len(reason), TAG_ERROR)

    def _load(self, program: bytes) -> None:
        key = program[:seg_codec.HEADER_SIZE]
        if key in self.loaded:
            self._event(len(program), TAG_INTERRUPT0)
            return
        spare = self._spare.pop(key, None)
        try:
            if spare is not None:
                segment, runner = spare.segment, spare.runner
                if runner is not None:
                    runner.reset()      # variable tensors (LSTM state) start over
            else:
                segment = seg_codec.decode(program)
                runner = None if self.timing_only else SegmentRunner(segment, self.kernels)
        except Exception as e:      # any reason the program cannot run on this stick
            log.warning("simulated stick: cannot load segment: %s", e)
            self._record("load_failed", length=len(program), error=str(e))
            self._refuse(e)
            return
        elsewhere = sum(h.estimate.cached_bytes for h in self.loaded.values()
                        if h.estimate is not None)
        estimate = (self.latency.estimate(segment, cached_elsewhere=elsewhere)
                    if self.latency is not None else None)
        handle = self.loaded[key] = _Loaded(segment, runner, estimate)
        self._by_crc[zlib.crc32(key)] = handle
        self._record("load", length=len(program), crc32=zlib.crc32(key),
                     ops=len(segment.ops))
        scale = 1.0 if self.timing_only else self.time_scale
        if estimate is not None and scale:
            self.ready_at = max(self.ready_at, time.monotonic()) + estimate.upload * scale
        self._event(len(program), TAG_INTERRUPT0)

    def _start_run(self, record: bytes) -> None:
        _, crc, n_inputs = RUN_RECORD.unpack(record)
        handle = self._by_crc.get(crc)
        if handle is None:
            self._record("run_unknown", value=crc, length=n_inputs)
            self._drop_inputs = n_inputs
            self._event(0, TAG_ERROR)
            return
        if n_inputs != len(handle.segment.inputs):
            self._fatal(f"RUN announces {n_inputs} inputs; the segment has "
                        f"{len(handle.segment.inputs)}")
            return
        self._run, self._inputs = handle, []
        if n_inputs == 0:
            self._execute()

    def _execute(self) -> None:
        handle, raw = self._run, self._inputs
        self._run, self._inputs = None, []
        seg = handle.segment
        if self.timing_only:    # zeros, readable after the whole estimated device time
            if handle.zeros is None:
                handle.zeros = [bytes(seg.tensors[t].nbytes) for t in seg.outputs]
            self._ran(handle, [memoryview(z) for z in handle.zeros], 1.0)
            return
        try:
            arrays = []
            for tid, data in zip(seg.inputs, raw):
                t = seg.tensors[tid]
                arrays.append(np.frombuffer(data, numpy_dtype(t.dtype).newbyteorder("<"))
                              .reshape(t.shape))
        except Exception as e:
            self._fatal(f"segment inputs do not decode: {e}")
            return
        try:
            outputs = handle.runner.run(arrays)
        except Exception as e:      # the model or its inputs, not the stick: refuse the run
            log.warning("simulated stick: segment run failed: %s", e)
            self.last_run = {}
            self._record("run_failed", error=str(e))
            self._refuse(e)
            return
        chunks = [memoryview(np.ascontiguousarray(
            out, numpy_dtype(seg.tensors[tid].dtype).newbyteorder("<")).tobytes())
            for tid, out in zip(seg.outputs, outputs)]
        self._ran(handle, chunks, self.time_scale)

    def _ran(self, handle: _Loaded, chunks: list, scale: float) -> None:
        """Queue a run's outputs and event; they are readable after the device time."""
        total = sum(len(c) for c in chunks)
        self.outputs.extend(c for c in chunks if len(c))
        handle.runs += 1
        est = handle.estimate
        device = est.per_run if est is not None else 0.0
        self.last_run = {"device_seconds": device, "runs": handle.runs, "output_bytes": total,
                         "upload_seconds": est.upload if est is not None and handle.runs == 1
                         else 0.0}
        if device and scale:    # (the upload's time was added at the load)
            self.ready_at = max(self.ready_at, time.monotonic()) + device * scale
        self._record("run", length=total, outputs=len(chunks))
        self._event(total, TAG_INTERRUPT0)

    def _fatal(self, reason: str) -> None:
        self._stream, self._run, self._drop_inputs = None, None, 0
        self.requests.reset()
        self.fatal = reason
        self._on_fatal(reason)

    # -- device -> host ------------------------------------------------------------------

    def output_ready(self) -> bool:
        """Whether an EP 0x81 read would answer now (:meth:`read_output` not None)."""
        if self.fatal is not None or time.monotonic() < self.ready_at:
            return False
        return bool(self.outputs) or self._reason is not None or bool(self._error_events)

    def event_ready(self) -> bool:
        """Whether an EP 0x82 read would answer now (:meth:`read_event` not None)."""
        return self.fatal is None and time.monotonic() >= self.ready_at and bool(self.events)

    def read_output(self, size: int) -> bytes | None:
        """Bytes for an EP 0x81 read of ``size``, or None when nothing is ready."""
        if self.fatal is not None or time.monotonic() < self.ready_at:
            return None
        if self.outputs:
            head = self.outputs[0]
            if len(head) <= size:
                self.outputs.popleft()
                return bytes(head)
            self.outputs[0] = head[size:]
            return bytes(head[:size])
        if self._reason is not None:
            head, self._reason = self._reason[:size], self._reason[size:] or None
            return bytes(head)
        if self._error_events:
            return b""          # the run was refused: a zero-length packet, see the event
        return None

    def read_event(self) -> bytes | None:
        if self.fatal is not None or time.monotonic() < self.ready_at:
            return None
        if self.events:
            record = self.events.popleft()
            if record[12] == TAG_ERROR:
                self._error_events -= 1
                if record[8:12] != b"\0\0\0\0":     # a reason follows on EP 0x81
                    self._reason = memoryview(self._reasons.popleft())
            return record
        return None
