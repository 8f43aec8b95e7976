"""The simulated Edge TPU: a device that runs coralrt segments with numpy
integer kernels and estimates what a real USB Accelerator would take."""

from __future__ import annotations

import logging
import threading
import time
import zlib

from coralrt.compile import segment as seg_format
from coralrt.delegate.device import EdgeTpuDevice, RunStats
from coralrt.errors import CoralRTError
from coralrt.sim.interpreter import SegmentRunner
from coralrt.sim.latency import LatencyModel, SegmentEstimate

__all__ = ["SimulatedEdgeTpu", "LoadedSegment"]

log = logging.getLogger("coralrt.sim")


class LoadedSegment:
    """A segment loaded on the (simulated) device.

    Like the real stick, which caches parameters during the first inference,
    the kernels are prepared (weights laid out, multipliers computed) on the
    first run; loading only checks that every operator has a kernel.
    """

    def __init__(self, segment, estimate: SegmentEstimate, key: int, kernels: dict):
        SegmentRunner.check_supported(segment, kernels)
        self.kernels = kernels
        self.segment = segment
        self.estimate = estimate
        self.key = key
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
        key = zlib.crc32(program) ^ (len(program) << 32)
        with self._lock:
            handle = self._loaded.get(key)
            if handle is not None:
                return handle
            segment = seg_format.decode(program)
            elsewhere = sum(h.estimate.cached_bytes for h in self._loaded.values())
            estimate = self.latency.estimate(segment, cached_elsewhere=elsewhere)
            handle = LoadedSegment(segment, estimate, key, self.kernels)
            self._loaded[key] = handle
            log.debug("%s: loaded segment (%d ops, %d parameter bytes)", self.path,
                      len(segment.ops), segment.parameters.size)
            return handle

    def run(self, handle: LoadedSegment, inputs):
        self._check_open()
        start = time.perf_counter()
        with self._lock:
            upload = 0.0
            if handle.runner is None:  # first run: the parameters go to the device
                handle.runner = SegmentRunner(handle.segment, handle.kernels)
                self.uploads += 1
                upload = handle.estimate.upload
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
