"""The simulated Edge TPU: a device that runs coralrt segments with numpy
integer kernels and estimates what a real USB Accelerator would take."""

from __future__ import annotations

import logging
import threading
import time

from coralrt.compile import segment as seg_format
from coralrt.delegate.device import EdgeTpuDevice, RunStats
from coralrt.errors import CoralRTError
from coralrt.sim.interpreter import SegmentRunner
from coralrt.sim.latency import LatencyModel, SegmentEstimate

__all__ = ["SimulatedEdgeTpu", "LoadedSegment"]

log = logging.getLogger("coralrt.sim")


class LoadedSegment:
    """A segment program loaded on the (simulated) device.

    Like the real stick, which caches a program's parameters during its first
    inference, the segment is decoded (checksum verified) and its kernels are
    prepared (weights laid out, multipliers computed) on the first run.
    """

    def __init__(self, program: bytes, key: bytes, kernels: dict):
        self.program = program
        self.key = key
        self.kernels = kernels
        self.segment = None
        self.estimate: SegmentEstimate | None = None
        self.runner: SegmentRunner | None = None


class SimulatedEdgeTpu(EdgeTpuDevice):
    """Runs coralrt segments; ``latency`` estimates real-stick time per run.

    ``time_scale`` 0 (default) returns as soon as the numpy kernels finish;
    1 also sleeps until the estimated device time has passed, for
    applications that want real-time behaviour from the simulation.
    """

    kind = "sim"

    def __init__(self, *, latency: LatencyModel | None = None, index: int = 0,
                 time_scale: float = 0.0, kernels: dict | None = None):
        """``kernels``: integer kernel factories plugins add for their operators."""
        self.latency = latency or LatencyModel()
        self.kernels = dict(kernels or {})
        self.path = f"sim:{index}"
        self.time_scale = time_scale
        self._loaded: dict[int, LoadedSegment] = {}
        self._open = False
        self._lock = threading.Lock()
        self._stats = RunStats()
        self.uploads = 0  # how many times parameters were uploaded (tests check reuse)

    def open(self) -> None:
        self._open = True

    def close(self) -> None:
        self._loaded.clear()
        self._open = False

    def _check_open(self) -> None:
        if not self._open:
            raise CoralRTError(f"device {self.path} is not open")

    def load(self, program: bytes) -> LoadedSegment:
        self._check_open()
        # The header holds the format version, total size and the CRC-32 of
        # everything after it: identical headers mean identical programs.
        key = bytes(program[:seg_format.HEADER_SIZE])
        with self._lock:
            handle = self._loaded.get(key)
            if handle is None:
                handle = self._loaded[key] = LoadedSegment(program, key, self.kernels)
            return handle

    def _upload(self, handle: LoadedSegment) -> float:
        """Decode and prepare a segment on its first run; the upload's estimated seconds."""
        segment = seg_format.decode(handle.program)
        SegmentRunner.check_supported(segment, handle.kernels)
        elsewhere = sum(h.estimate.cached_bytes for h in self._loaded.values()
                        if h.estimate is not None)
        handle.estimate = self.latency.estimate(segment, cached_elsewhere=elsewhere)
        handle.runner = SegmentRunner(segment, handle.kernels)
        handle.segment = segment
        self.uploads += 1
        log.debug("%s: uploaded segment (%d ops, %d parameter bytes)", self.path,
                  len(segment.ops), segment.parameters.size)
        return handle.estimate.upload

    def run(self, handle: LoadedSegment, inputs):
        self._check_open()
        start = time.perf_counter()
        with self._lock:
            upload = self._upload(handle) if handle.runner is None else 0.0
            outputs = handle.runner.run(inputs)
        host = time.perf_counter() - start
        device = handle.estimate.per_run + upload
        if self.time_scale > 0 and device * self.time_scale > host:
            time.sleep(device * self.time_scale - host)
        self._stats = RunStats(host_seconds=host, device_seconds=device,
                               parameter_upload_seconds=upload)
        return outputs

    @property
    def last_stats(self) -> RunStats:
        return self._stats
