"""``Context``: the sticks, the tile-model sessions and the scheduler of
``coralrt.gp``, and the array operations on top of them.

What runs where: validation, quantization, tiling and the final accumulation
run on the host in the calling thread (synchronous calls) or in a task thread
(:meth:`Context.submit`); each tile job runs one generated int8 model on one
device from a :class:`~coralrt.gp._scheduler.Scheduler` worker (one per stick).
Each worker keeps its own sessions, keyed by the model's identity (operation,
tile shape, quantization and, for data-carrying models, a hash of the int8
constant), at most ``max_sessions`` of them (least recently used closed first);
the on-disk JIT cache keeps compiled models across sessions and processes.

Targets: ``sim`` (the default; simulated sticks, bit-exact with LiteRT's
reference kernels, each run waiting the latency model's estimate), ``coral``
(USB sticks; a model whose constant B or kernel is new is compiled once by
edgetpu_compiler or a compile service, which takes seconds, then cached) and
``cpu`` (the same int8 models on the CPU backend, one worker).

Error model: see :mod:`coralrt.gp._scaling`; results are float64 but carry
the 8-bit quantization error of the inputs and of every tile's output.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from coralrt import _targets as targets
from coralrt.errors import ConfigError
from coralrt.gp import _checks as checks, _tensorize as tensorize, _tile_models as tm
from coralrt.gp._scaling import RULES
from coralrt.gp._scheduler import Scheduler
from coralrt._session import InferenceSession

__all__ = ["Context", "OPERATIONS"]

log = logging.getLogger("coralrt.gp")

OPERATIONS = ("matmul", "conv2d", "add", "sub", "mul", "tanh", "relu", "mean", "max")
GEMM_FORMS = ("auto", "conv", "fc")


class Context:
    """Edge TPU array operations (see the module docstring).

    :param target: ``"sim"``, ``"coral"`` or ``"cpu"``.
    :param devices: ``sim``: a number of simulated sticks to open (default 1) or a
        list of open devices; ``coral``: device paths ("usb:0") or open devices
        (default: the first stick); ``cpu``: must be None.
    :param scaling: ``"bound"`` (tight provable output ranges), ``"study"``
        (the GPTPU study's rules) or ``"sample"`` (GEMM ranges from sampled rows,
        may saturate); see :mod:`coralrt.gp._scaling`.
    :param gemm: ``"auto"`` (the form the latency model estimates faster for the
        tile shape), ``"conv"`` or ``"fc"``.
    """

    def __init__(self, target: str = "sim", devices=None, *, scaling: str = "bound",
                 gemm: str = "auto", m_tile: int = 128, k_tile: int = 128,
                 n_tile: int = 128, max_sessions: int = 64):
        names = _targets()
        if target not in names:
            raise ConfigError(f"unknown target {target!r}; choose {', '.join(names[:-1])} "
                              f"or {names[-1]}")
        if scaling not in RULES:
            raise ConfigError(f"unknown scaling {scaling!r}; choose bound, study or sample")
        if gemm not in GEMM_FORMS:
            raise ConfigError(f"unknown gemm form {gemm!r}; choose {', '.join(GEMM_FORMS)}")
        for name, v in (("m_tile", m_tile), ("k_tile", k_tile), ("n_tile", n_tile),
                        ("max_sessions", max_sessions)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive int, not {v!r}")
        self.target, self.rule, self.gemm = target, scaling, gemm
        self.tiles = dict(m_tile=m_tile, k_tile=k_tile, n_tile=n_tile)
        self._max_sessions = max_sessions
        self.devices, self._owned = _open_devices(target, devices)
        n = len(self.devices)
        self._sessions = [OrderedDict() for _ in range(n)]
        self._models: dict = {}
        self._lock = threading.Lock()
        self._forms: dict = {}
        #: per tile shape (rows, k, n): estimated device seconds of each GEMM form
        self.gemm_estimates: dict = {}
        #: per device: estimated Edge TPU seconds of all runs (latency model)
        self.device_seconds = [0.0] * n
        self.scheduler = Scheduler(n)
        self._tasks = ThreadPoolExecutor(max_workers=max(2, 2 * n),
                                         thread_name_prefix="coralrt-gp-task")
        self._futures: list[Future] = []
        self._closed = False

    # -- operations -----------------------------------------------------------

    def matmul(self, a, b) -> np.ndarray:
        """``a @ b`` for 2-D float arrays (M x K) and (K x N): float64 (M x N)."""
        a, b = checks.matmul_operands(a, b)
        return tensorize.matmul(self._run, a, b, self.rule, self._choose_form, **self.tiles)

    def conv2d(self, x, w, stride: int = 1) -> np.ndarray:
        """Single-channel 2-D VALID convolution (cross-correlation) of ``x`` (H x W)
        by ``w`` (kh x kw); float64 ((H - kh) // stride + 1, (W - kw) // stride + 1)."""
        x, w, stride = checks.conv_operands(x, w, stride)
        return tensorize.conv2d(self._run, x, w, stride, self.rule)

    def add(self, a, b) -> np.ndarray:
        return self._binary("add", a, b)

    def sub(self, a, b) -> np.ndarray:
        return self._binary("sub", a, b)

    def mul(self, a, b) -> np.ndarray:
        return self._binary("mul", a, b)

    def tanh(self, x) -> np.ndarray:
        return tensorize.unary(self._run, "tanh", checks.array(x, "x"), self.rule)

    def relu(self, x) -> np.ndarray:
        return tensorize.unary(self._run, "relu", checks.array(x, "x"), self.rule)

    def mean(self, x, axis=None) -> np.float64:
        """Mean of the whole array (``axis`` must be None)."""
        return tensorize.reduce(self._run, "mean", checks.array(x, "x", axis=axis))

    def max(self, x, axis=None) -> np.float64:
        """Maximum of the whole array (``axis`` must be None)."""
        return tensorize.reduce(self._run, "max", checks.array(x, "x", axis=axis))

    def _binary(self, op, a, b):
        a, b = checks.same_shape(a, b)
        return tensorize.elementwise(self._run, op, a, b, self.rule)

    # -- tasks ----------------------------------------------------------------

    def submit(self, op, *args, **kwargs) -> Future:
        """Queue ``op`` (a name from OPERATIONS or one of this context's methods)
        as a task; returns a Future of its result.  Arguments are checked now."""
        self._check_open()
        if isinstance(op, str):
            if op not in OPERATIONS:
                raise ConfigError(f"unknown operation {op!r}; choose one of "
                                  f"{', '.join(OPERATIONS)}")
            name = op
        else:
            name = getattr(op, "__name__", None)
            if getattr(op, "__self__", None) is not self or name not in OPERATIONS:
                raise ConfigError(f"submit takes an operation name or a method of this "
                                  f"Context, not {op!r}")
        checks.validate(name, args, kwargs)
        future = self._tasks.submit(getattr(self, name), *args, **kwargs)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)
        return future

    def sync(self, timeout: float | None = None) -> None:
        """Wait for every submitted task (their futures hold results and errors)."""
        with self._lock:
            futures = list(self._futures)
        done, left = wait(futures, timeout)
        if left:
            raise TimeoutError(f"{len(left)} task(s) still running")
        self.scheduler.sync(timeout)

    # -- jobs -----------------------------------------------------------------

    def _run(self, key, make_model, feed, affinity=None) -> Future:
        """One tile job: ``feed`` (a dict, or a list of dicts run in turn) through
        the model ``key`` (built by ``make_model`` on first use)."""
        self._check_open()
        return self.scheduler.submit(lambda d: self._job(d, key, make_model, feed),
                                     affinity=affinity)

    def _job(self, d: int, key, make_model, feed) -> np.ndarray:
        session = self._session(d, key, make_model)
        feeds = feed if isinstance(feed, list) else [feed]
        outs = []
        for f in feeds:
            outs.append(session.run(f)["c"])
            if self.target != "cpu":
                self.device_seconds[d] += sum(r.get("device_seconds") or 0.0
                                              for r in session.profile())
        return outs[0] if len(outs) == 1 else np.stack([o.reshape(-1) for o in outs])

    def _session(self, d: int, key, make_model) -> InferenceSession:
        cache = self._sessions[d]          # only worker d touches it
        session = cache.get(key)
        if session is not None:
            cache.move_to_end(key)
            return session
        with self._lock:
            model = self._models.get(key)
        if model is None:
            model = make_model()
            with self._lock:
                self._models[key] = model
                while len(self._models) > 4 * self._max_sessions:
                    self._models.pop(next(iter(self._models)))
        device = self.devices[d]
        session = InferenceSession(model, target=self.target, device=device)
        if session.compile_info and not session.compile_info.get("cache_hit") \
                and self.target == "coral":
            log.info("compiled tile model %s for coral with edgetpu_compiler (a new constant "
                     "operand is compiled once, then served from the cache)", key[0])
        tm.check_mapped(session, str(key[:2]))
        cache[key] = session
        while len(cache) > self._max_sessions:
            cache.popitem(last=False)[1].close()
        return session

    def _choose_form(self, rows: int, k: int, n: int) -> str:
        if self.gemm != "auto":
            return self.gemm
        shape = (rows, k, n)
        with self._lock:
            form = self._forms.get(shape)
        if form is None:
            est = tm.estimate_gemm_forms(rows, k, n)
            form = "conv" if est["conv"] <= est["fc"] else "fc"
            with self._lock:
                self._forms[shape] = form
                self.gemm_estimates[shape] = est
        return form

    # -- life cycle -----------------------------------------------------------

    def stats(self) -> dict:
        """Jobs and busy seconds per device, estimated device seconds, sessions."""
        s = self.scheduler
        return {"jobs": list(s.jobs), "busy_seconds": list(s.busy),
                "device_seconds": list(self.device_seconds),
                "sessions": [len(c) for c in self._sessions],
                "gemm_forms": dict(self._forms)}

    def _check_open(self):
        if self._closed:
            raise ConfigError("the coralrt.gp Context is closed")

    def close(self) -> None:
        """Finish queued work, close the sessions and the devices this context opened."""
        if self._closed:
            return
        self._closed = True
        self._tasks.shutdown(wait=True)
        self.scheduler.close()
        for cache in self._sessions:
            for session in cache.values():
                session.close()
            cache.clear()
        for dev in self._owned:
            dev.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _targets() -> list[str]:
    """The session targets a context runs on (``auto`` is not one): those with
    an Edge TPU device kind, then those without (the CPU)."""
    found = targets.registered()
    return [t.name for t in found if t.device_kind] + [t.name for t in found
                                                       if not t.device_kind]


def _open_devices(target: str, devices):
    """(device per worker, the ones this context opened and must close)."""
    if target == "cpu":
        if devices is not None:
            raise ConfigError("target 'cpu' takes no devices")
        return [None], []
    if target == "sim":
        if devices is None or isinstance(devices, int):
            n = 1 if devices is None else devices
            if isinstance(n, bool) or n < 1:
                raise ConfigError(f"devices must be a positive number of sticks, not {n!r}")
            from coralrt._sim.stick import open_simulated_sticks
            sticks = open_simulated_sticks(n)
            return list(sticks), list(sticks)
    if devices is None:
        devices = ["usb:0"]
    if isinstance(devices, (str, int)) or not isinstance(devices, (list, tuple)) \
            or not devices:
        raise ConfigError(f"devices must be a non-empty list for target {target!r}, "
                          f"not {devices!r}")
    opened, owned = [], []
    for dev in devices:
        if isinstance(dev, str):
            if target != "coral":
                raise ConfigError(f"device paths are for target 'coral', not {target!r}")
            from coralrt._usb import open_device
            try:
                dev = open_device(dev)
            except BaseException:
                for o in owned:
                    o.close()
                raise
            owned.append(dev)
        opened.append(dev)
    return opened, owned
