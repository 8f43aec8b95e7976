"""Replicate a whole program on each of several sticks, and spread requests over them.

:func:`build_replicated_program` builds one
:class:`~coralrt._runtime.executor.ExecutorProgram` per stick, every Edge TPU
segment of the model on that stick, with CPU interpreters of its own (a
LiteRT interpreter must not be entered by two threads at once).  Each request
runs entirely on one free replica: :meth:`ReplicatedProgram.run` takes the
first free one (waiting when all are busy), so callers in different threads,
and a session's workers (one per replica, :mod:`coralrt._runtime.worker`),
keep every stick busy.  This is for throughput on models with one Edge TPU
segment, which a pipeline cannot spread (docs/multi-stick.md).

    program = build_replicated_program(compiled, devices=[d0, d1], backend=cpu)
    outputs = program.run(inputs)          # on any free stick; safe from many threads
    program.stats()                        # requests per stick, sticks set aside

A stick whose request fails with a :class:`~coralrt.errors.DeviceError` (a
stall, a timeout, an unplugged stick) fails that request only and is set
aside: later requests go to the other sticks, and when every stick is set
aside ``run`` raises :class:`~coralrt.errors.DeviceLostError` naming each
one's failure.  ``after_reset`` (``InferenceSession.reset()``) takes them back.
Other errors (a kernel refusing these inputs) leave the stick in service.

:func:`build_multi_stick_program` chooses between this and the pipeline
(:mod:`coralrt._runtime.pipeline`) for a session given a list of sticks.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence

import numpy as np

from coralrt.errors import ConfigError, DeviceError, DeviceLostError
from coralrt._formats.opnames import DEVICE_OPS
from coralrt._runtime.executor import ExecutorProgram, build_program, step_rows
from coralrt._runtime.pipeline import build_pipelined_program
from coralrt._runtime.program import NoLock, Program
from coralrt._runtime.interrupt import interruptible

__all__ = ["STRATEGIES", "ReplicatedProgram", "build_multi_stick_program",
           "build_replicated_program", "default_strategy"]

log = logging.getLogger("coralrt.pipeline")

STRATEGIES = ("replicate", "pipeline")


class ReplicatedProgram(Program):
    """One whole program per stick; each request runs on one free stick.

    ``lock`` is a no-op: ``run`` is safe from several threads at once (each
    takes its own replica), and ``concurrency`` is the number of replicas.
    """

    def __init__(self, replicas: Sequence[ExecutorProgram], devices: Sequence):
        super().__init__()
        if not replicas:
            raise ConfigError("a replicated program needs at least one replica")
        self.replicas = list(replicas)
        self.devices = list(devices)
        self.lock = NoLock()
        self.concurrency = len(self.replicas)
        self.inputs, self.outputs = self.replicas[0].inputs, self.replicas[0].outputs
        self.requests = [0] * len(self.replicas)     # completed per replica
        self.failed: dict[int, BaseException] = {}   # set aside, by replica index
        self._free: queue.SimpleQueue = queue.SimpleQueue()   # C: no lock to leave taken
        for i in range(len(self.replicas)):
            self._free.put(i)
        self._aside: list[int] = []
        self._aside_lock = threading.Lock()
        self._last = 0

    def _take(self) -> int:
        while True:
            if len(self.failed) == len(self.replicas):
                raise self._all_failed()
            i = self._free.get()
            with self._aside_lock:      # not while after_reset takes them back
                if i not in self.failed:
                    return i
                self._aside.append(i)

    def _all_failed(self) -> DeviceLostError:
        why = "; ".join(f"{self.devices[i].path}: {e}" for i, e in sorted(self.failed.items()))
        return DeviceLostError(f"every stick of this replicated program failed ({why}); "
                               f"reset the session (InferenceSession.reset()) or create it "
                               f"again")

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """One request, entirely on the first free stick."""
        i = self._take()
        try:
            with interruptible():
                outputs = self.replicas[i].run(inputs)
        except DeviceError as e:
            self.failed[i] = e
            log.warning("replica on %s failed (%s: %s); its requests go to the other "
                        "stick(s) until the session is reset", self.devices[i].path,
                        type(e).__name__, e)
            raise
        finally:
            self._free.put(i)
        self.requests[i] += 1
        self._last = i
        return outputs

    def after_reset(self) -> None:
        """The sticks were reset: take the ones set aside back into service."""
        with self._aside_lock:
            self.failed.clear()
            aside, self._aside = self._aside, []
        for i in aside:
            self._free.put(i)

    def profile(self) -> list[dict]:
        """Per step of the last request, with the stick that ran it."""
        rows = step_rows(self.replicas[self._last].steps)
        for row in rows:
            row["device"] = self.devices[self._last].path
        return rows

    def stats(self) -> dict:
        """Requests completed per stick, and the sticks set aside (with why)."""
        return {"replicas": [{"device": d.path, "requests": n,
                              "failed": repr(self.failed[i]) if i in self.failed else None}
                             for i, (d, n) in enumerate(zip(self.devices, self.requests))]}

    def __repr__(self) -> str:
        return f"<ReplicatedProgram on {', '.join(d.path for d in self.devices)}>"


def build_replicated_program(compiled, *, devices: Sequence, backend,
                             num_threads: int | None = None, cpu_kernels: str = "optimized",
                             host=None, override_builtins: bool = False) -> ReplicatedProgram:
    """A :class:`ReplicatedProgram` for ``compiled``: every Edge TPU segment on
    each of ``devices``, one set of CPU interpreters per stick."""
    devices = list(devices)
    if not devices:
        raise ConfigError("a replicated program needs at least one Edge TPU device")
    if len(set(map(id, devices))) != len(devices):
        raise ConfigError(f"the same device appears twice in {[d.path for d in devices]}")
    replicas = [build_program(compiled, device=d, backend=backend, num_threads=num_threads,
                              cpu_kernels=cpu_kernels, host=host,
                              override_builtins=override_builtins) for d in devices]
    return ReplicatedProgram(replicas, devices)


def default_strategy(compiled) -> str:
    """"replicate" for a model with exactly one Edge TPU segment, else "pipeline"."""
    n = sum(1 for op in compiled.main.operators if op.name in DEVICE_OPS)
    return "replicate" if n == 1 else "pipeline"


def check_strategy(strategy: str | None) -> None:
    if strategy is not None and strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy!r}; choose one of "
                          f"{', '.join(map(repr, STRATEGIES))} (or None: replicate a model "
                          f"with one Edge TPU segment, pipeline the others)")


def build_multi_stick_program(compiled, *, devices: Sequence, strategy: str | None, backend,
                              num_threads: int | None = None, cpu_kernels: str = "optimized",
                              host=None, override_builtins: bool = False,
                              depth: int = 2) -> Program:
    """The program of ``compiled`` over a list of sticks: ``strategy`` "replicate"
    (:func:`build_replicated_program`), "pipeline" (its segments as stages,
    :func:`~coralrt._runtime.pipeline.build_pipelined_program`), or None
    (:func:`default_strategy`)."""
    check_strategy(strategy)
    chosen = strategy or default_strategy(compiled)
    common = dict(devices=devices, backend=backend, num_threads=num_threads,
                  cpu_kernels=cpu_kernels, host=host, override_builtins=override_builtins)
    log.debug("%d stick(s), strategy %s%s", len(devices), chosen,
              "" if strategy else " (default)")
    if chosen == "replicate":
        return build_replicated_program(compiled, **common)
    return build_pipelined_program(compiled, depth=depth, **common)
