"""Both cores for the simulated Edge TPU's element-wise work.

NumPy releases the GIL inside its loops, so the independent row bands of a
depthwise convolution or a requantization run truly in parallel on a small
thread pool.  :func:`for_bands` splits ``[0, total)`` into bands and hands
them out first come, first served to the calling thread and up to
``threads() - 1`` pool threads; it returns once every band is done (no band
outlives the call, even when an exception or an interrupt ends it early).

Matrix products run on the bands too, one band per thread: while the
simulator runs, :func:`blas_single_threaded` holds the BLAS NumPy links
(OpenBLAS, MKL, ...; through threadpoolctl) to one thread.  Two thread pools
on the same cores, each waiting on the other, are how a simulator slows
down tenfold the moment another process takes a core: OpenBLAS's threads
spin while waiting for each other.  The limit is process-wide and counted:
it is set when the first simulated inference starts and lifted when the
last one in flight ends, so NumPy code running beside the simulator in other
threads gets single-threaded BLAS meanwhile.

``CORALRT_SIM_THREADS`` sets the number of threads: a positive integer, or
``auto`` for the CPUs the process may use (at most 8).  The default is 1,
everything on the calling thread, because that is what measured fastest on
the two-core machines the project runs on: row bands on two threads made
MobileNet v2 5-10 % slower, and even two independent inferences in two
processes gained only 1.13x in throughput, the cores sharing the memory
bandwidth these element-wise loops are bound by (docs/simulator.md, "Speed
of the simulation").  Machines whose cores scale can opt in.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from coralrt.errors import ConfigError

log = logging.getLogger("coralrt.sim")

__all__ = ["threads", "for_bands", "blas_single_threaded"]

_MAX_AUTO = 8
_local = threading.local()            # .busy: True while a thread works on bands
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def threads() -> int:
    """Threads the simulated Edge TPU uses (``CORALRT_SIM_THREADS``, default 1)."""
    raw = os.environ.get("CORALRT_SIM_THREADS", "").strip().lower()
    if not raw:
        return 1
    if raw == "auto":
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):      # not Linux
            cpus = os.cpu_count() or 1
        return max(1, min(cpus, _MAX_AUTO))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"CORALRT_SIM_THREADS must be a positive integer or 'auto', "
                          f"got {raw!r}")
    return n


def _executor(helpers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < helpers:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=helpers, thread_name_prefix="coralrt-sim")
            _pool_size = helpers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def for_bands(total: int, band: int, fn) -> None:
    """Call ``fn(start, stop)`` for consecutive bands of ``band`` items covering
    ``[0, total)``, on up to :func:`threads` threads.

    ``fn`` must only write what its band owns; it runs on whichever thread
    takes the band.  Called from inside a band, it runs its bands in order on
    the current thread.
    """
    band = max(1, int(band))
    pieces = -(-total // band) if total > 0 else 0
    n = threads() if pieces > 1 and not getattr(_local, "busy", False) else 1
    if n == 1:
        for start in range(0, total, band):
            fn(start, min(start + band, total))
        return
    lock = threading.Lock()
    state = {"next": 0, "stop": False}

    def take():
        with lock:
            if state["stop"] or state["next"] >= pieces:
                return None
            i = state["next"]
            state["next"] = i + 1
        return i * band, min((i + 1) * band, total)

    def work():
        _local.busy = True                 # a band calling for_bands runs it serially
        try:
            while (piece := take()) is not None:
                fn(*piece)
        except BaseException:
            with lock:
                state["stop"] = True       # a failure stops the other bands early
            raise
        finally:
            _local.busy = False

    futures = [_executor(n - 1).submit(work) for _ in range(min(n, pieces) - 1)]
    try:
        work()
    finally:
        with lock:
            state["stop"] = True
        errors = []
        for f in futures:
            if not f.cancel():
                try:
                    f.result()
                except BaseException as exc:   # re-raised below, after all are done
                    errors.append(exc)
    if errors:
        raise errors[0]


_blas = {"depth": 0, "limit": None, "controller": None}
_blas_lock = threading.Lock()


def _controller():
    if _blas["controller"] is None:
        try:
            from threadpoolctl import ThreadpoolController
            _blas["controller"] = ThreadpoolController()
        except Exception as exc:           # noqa: BLE001  missing or failing: run without it
            log.debug("BLAS threads not limited (%s: %s)", type(exc).__name__, exc)
            _blas["controller"] = False
    return _blas["controller"]


def _limit(controller):
    try:
        return controller.limit(limits=1, user_api="blas")
    except Exception as exc:               # noqa: BLE001  an inference never fails for it
        log.debug("BLAS threads not limited (%s: %s)", type(exc).__name__, exc)
        return None


@contextmanager
def blas_single_threaded():
    """BLAS limited to one thread while any simulated inference runs (nestable,
    thread-safe; see the module docstring)."""
    with _blas_lock:
        if _blas["depth"] == 0:
            controller = _controller()
            _blas["limit"] = _limit(controller) if controller else None
        _blas["depth"] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas["depth"] -= 1
            if _blas["depth"] == 0 and _blas["limit"] is not None:
                limit, _blas["limit"] = _blas["limit"], None
                try:
                    limit.restore_original_limits()
                except Exception as exc:   # noqa: BLE001
                    log.debug("BLAS thread limit not restored (%s)", exc)
