"""``SessionOptions``: every option of :class:`coralrt.InferenceSession`, declared once.

A session is ``InferenceSession(model, target, options=None, **overrides)``:
``options`` (default ``SessionOptions()``) with ``overrides`` replacing
fields by name, so ``InferenceSession(m, "sim", max_pending=8)`` and
``InferenceSession(m, "sim", SessionOptions(max_pending=8))`` are the same
session.  The session keeps the options it ran with (``session.options``)
and creates a signature's own session with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from coralrt._runtime.device import EdgeTpuDevice
from coralrt._runtime.replicate import check_strategy
from coralrt._runtime.worker import check_max_pending

if TYPE_CHECKING:
    from coralrt._compile.cache import CompileCache

__all__ = ["SessionOptions", "DeviceSpec", "check_names", "with_overrides"]

#: What ``device=`` accepts: an open device, a path ("usb:0", a port path), or a list of those.
DeviceSpec = Union[EdgeTpuDevice, str, Sequence[Union[EdgeTpuDevice, str]], None]


@dataclass(frozen=True)
class SessionOptions:
    """How a session loads and runs its model (each field is also a keyword
    argument of :class:`coralrt.InferenceSession`).

    :param num_threads: CPU backend threads; ``None`` lets the backend choose.
    :param backend: CPU backend name (``"litert"``, ``"tflite_runtime"``);
        ``None`` picks the first installed.
    :param cpu_kernels: ``"optimized"`` (default) or ``"reference"`` (TFLite's
        reference kernels, ``BUILTIN_REF``).
    :param partition_mode: ``"multi"`` (default) or ``"compat"``, for the
        just-in-time compiler (``sim`` and ``coral`` targets).
    :param rewrites: graph rewrites applied before partitioning (docs/rewrites.md):
        ``"exact"`` (those that keep the integer results; the default in
        ``multi`` mode), ``"auto"`` (approximations too, each reported in
        ``compile_info["rewrites"]``), ``"none"`` (the default in ``compat``
        mode: edgetpu_compiler rewrites nothing) or a list of rewrite names.
        The ``cpu`` target never rewrites.
    :param cache: a :class:`coralrt._compile.cache.CompileCache`; ``None`` uses
        the default one (``CORALRT_CACHE_DIR``, ``CORALRT_CACHE=0``).
    :param device: the stick(s) for the Edge TPU steps: an open
        :class:`coralrt._runtime.device.EdgeTpuDevice`, a path ("usb:0", ":1",
        a port path) or a list of those (see ``strategy``); ``None``: a
        simulated stick for ``sim``, the first stick found for ``coral``.
    :param plugins: plugin objects to register for this session, in addition
        to coralrt's built-ins and the installed ``coralrt`` entry points.
    :param override_builtins: let plugin CPU kernels registered for builtin
        operators replace the CPU backend's kernels for those operators.
    :param pipeline_depth: requests queued between pipeline stages when
        ``device`` is a list of sticks.
    :param compiler_url: a compile service (``coralrt serve-compiler``) that
        compiles this model's Edge TPU segments for ``coral``, instead of
        ``CORALRT_COMPILER_URL`` or a local edgetpu_compiler
        (docs/compile-service.md).
    :param strategy: how a list of sticks is used: ``"replicate"`` (the whole
        program on every stick, each request on one free stick: throughput),
        ``"pipeline"`` (segment *i* on stick *i mod n*, as stages), or
        ``None``: replicate when the compiled model has exactly one Edge TPU
        segment, pipeline otherwise.  Ignored for a single device
        (docs/multi-stick.md).
    :param max_pending: requests :meth:`~coralrt.InferenceSession.submit`
        queues before it blocks (or raises
        :class:`~coralrt.errors.QueueFullError`); default 4.
    :param driver: how ``coral`` reaches the stick: ``"coralrt"`` (the default,
        coralrt's pyusb driver) or ``"libedgetpu"`` (Google's library as a LiteRT
        delegate, probed in a child process first; one stick; docs/libedgetpu.md);
        ``None``: ``CORALRT_DRIVER``, else ``"coralrt"``.  ``"libedgetpu"`` on
        ``cpu``/``sim`` is a ConfigError (``CORALRT_DRIVER`` is not applied there).

    ``strategy`` and ``max_pending`` are checked here (a
    :class:`~coralrt.errors.ConfigError`); the others when a session uses
    them, since what they accept depends on the target, the installed CPU
    backends and the plugins.
    """

    num_threads: int | None = None
    backend: str | None = None
    cpu_kernels: str = "optimized"
    partition_mode: str = "multi"
    rewrites: str | Sequence[str] | None = None
    cache: CompileCache | None = None
    device: DeviceSpec = None
    plugins: Sequence[object] | None = None
    override_builtins: bool = False
    pipeline_depth: int = 2
    compiler_url: str | None = None
    strategy: str | None = None
    max_pending: int = 4
    driver: str | None = None

    def __post_init__(self) -> None:
        check_strategy(self.strategy)
        check_max_pending(self.max_pending)


_FIELDS = frozenset(f.name for f in dataclasses.fields(SessionOptions))


def check_names(overrides: Mapping[str, object],
                caller: str = "InferenceSession.__init__()") -> None:
    """A TypeError naming the first of ``overrides`` that is no option, as
    Python's for an unknown keyword argument of ``caller``."""
    for name in overrides:
        if name not in _FIELDS:
            raise TypeError(f"{caller} got an unexpected keyword argument {name!r}")


def with_overrides(options: SessionOptions | None, overrides: Mapping[str, object],
                   caller: str = "InferenceSession.__init__()") -> SessionOptions:
    """``options`` (None: the defaults) with ``overrides`` replacing fields; a
    name that is no option is a TypeError, as an unknown keyword argument of
    ``caller`` is."""
    check_names(overrides, caller)
    if options is None:
        return SessionOptions(**overrides)
    if not isinstance(options, SessionOptions):
        raise TypeError(f"options must be a coralrt.SessionOptions, not "
                        f"{type(options).__name__}")
    return dataclasses.replace(options, **overrides) if overrides else options
