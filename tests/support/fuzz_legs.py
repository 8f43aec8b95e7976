"""The model fuzzer's parent side: one child process per leg, and the differential check.

:class:`Legs` keeps a worker process (:mod:`tests.support.fuzz_worker`) per
leg, sends each case to all of them at once (they run in parallel) and
collects their answers.  The worker runs each case in a process of its own
and reports a case whose process dies (a native crash: SIGSEGV, SIGABRT) or
does not answer in time; a worker that dies itself is reported the same way
and replaced by a fresh one at the next case.  :func:`check` turns the answers of one
case into the list of what is wrong with them:

- a leg that died, hung, or raised something that is not a coralrt error;
- legs that disagree: one runs the model and another refuses it, or they
  refuse it with different error classes (compared as the direct subclasses
  of ``CoralRTError``: ``ModelError``, ``InputError``, ``InferenceError``...).
  Two refusals are a leg declining rather than a disagreement, and that leg
  is left out of the comparison: ``UnsupportedOperatorError`` on any leg (no
  kernel for an operator: the NumPy backend lacks float convolutions, for
  example), and a ``ModelError`` (or subclass) of the ``numpy`` or ``sim``
  leg after coralrt's validation passed (their integer kernels refuse what
  they cannot reproduce bit for bit: zero points outside their type's range,
  subnormal scales, mixed types; docs/backends.md and
  coralrt/_sim/kernels/__init__.py).  A LiteRT leg refusing what another leg
  runs is a disagreement;
- legs that ran it and give different outputs.  ``litert-reference``,
  ``numpy`` and ``sim`` must agree bit for bit on integer outputs (the NumPy
  backend's and the simulator's integer kernels reproduce LiteRT's reference
  kernels); LiteRT's default (optimized) kernels round differently in a few
  operators and may differ from any other leg by :data:`DEFAULT_LSB` on
  integer outputs.  Float outputs agree within :data:`FLOAT_RTOL` (the NumPy
  backend's float kernels sum in another order, docs/backends.md), NaNs at
  the same places.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from support.fuzz_worker import LEGS

REPO_ROOT = Path(__file__).resolve().parents[2]
HAVE_LITERT = importlib.util.find_spec("ai_edge_litert") is not None
LITERT_LEGS = ("litert-default", "litert-reference")
#: Largest difference between LiteRT's default kernels and the others on an
#: integer output (docs/backends.md: at most 2 LSB on the uint8 MobileNet).
DEFAULT_LSB = 2
FLOAT_RTOL = 1e-4
#: Seconds one case may take on one leg (load and one inference).
CASE_TIMEOUT = 60.0


def available_legs() -> tuple[str, ...]:
    """Every leg, without the LiteRT ones when ai-edge-litert is not installed."""
    return tuple(leg for leg in LEGS if HAVE_LITERT or leg not in LITERT_LEGS)


class LegWorker:
    """One long-lived child process running cases on ``leg``."""

    def __init__(self, leg: str, timeout: float = CASE_TIMEOUT):
        self.leg, self.timeout = leg, timeout
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()
        self.log_start = 0
        self.sent_at = 0.0

    def send(self, line: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            # No compile cache: each mutated model would only add an entry.
            # One BLAS thread: the worker forks a process per case.
            path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
            env = dict(os.environ, PYTHONPATH=path, CORALRT_CACHE="0",
                       OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.fuzz_worker", self.leg,
                 str(self.timeout)], cwd=REPO_ROOT,
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self.log.seek(0, os.SEEK_END)
        self.log_start = self.log.tell()
        self.sent_at = time.monotonic()
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def _read(self, n: int, deadline: float) -> bytes | None:
        out = b""
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, n - len(out))
            if not chunk:
                return None
            out += chunk
        return out

    def stderr_tail(self, limit: int = 1500) -> str:
        self.log.seek(self.log_start)
        lines = [ln for ln in self.log.read().decode(errors="replace").splitlines()
                 if ln.strip() and not ln.startswith("INFO: ")]
        return "\n".join(lines)[-limit:]

    def receive(self) -> dict:
        # The worker times the case out itself; this is for the worker hanging.
        timeout = self.timeout + 60
        deadline = self.sent_at + timeout
        try:
            head = self._read(8, deadline)
            body = head and self._read(struct.unpack("<Q", head)[0], deadline)
        except TimeoutError:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return {"status": "hang", "message": f"the worker gave no answer within {timeout:g} s"}
        if body is None:
            code = self.proc.wait()
            self.proc = None
            how = signal.Signals(-code).name if code < 0 else f"exit status {code}"
            return {"status": "died", "signal": how,
                    "message": f"the worker died ({how}): {self.stderr_tail()}"}
        answer = pickle.loads(body)
        if answer["status"] == "died":
            answer["message"] += f": {self.stderr_tail()}"
        return answer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log.close()


class Legs:
    """A worker per leg; :meth:`run` gives every leg's answer to one model file."""

    def __init__(self, legs=None, timeout: float = CASE_TIMEOUT):
        self.workers = {leg: LegWorker(leg, timeout) for leg in (legs or available_legs())}

    def run(self, path, input_seed: int = 0) -> dict:
        for w in self.workers.values():
            w.send(f"{path}\t{input_seed}")
        return {leg: w.receive() for leg, w in self.workers.items()}

    def close(self) -> None:
        for w in self.workers.values():
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- the differential check ---------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    legs: tuple[str, ...]
    kind: str       # died, hang, raw, disagree, outputs
    message: str

    def __str__(self) -> str:
        return f"[{'/'.join(self.legs)}] {self.kind}: {self.message}"


#: Legs whose own kernels may decline an operator with a ModelError (see the module docstring).
DECLINING_LEGS = ("numpy", "sim")


def declined(leg: str, answer: dict) -> bool:
    """Whether ``answer`` is ``leg`` saying it cannot run an operator (left out of the check)."""
    if answer["status"] != "error":
        return False
    return "UnsupportedOperatorError" in answer["family"] or (
        leg in DECLINING_LEGS and "ModelError" in answer["family"]
        and answer.get("stage") == "session")


def outcome(answer: dict) -> str:
    """One word for a leg's answer: ``ok``, the error class, ``died SIGSEGV``, ``hang``, ``raw``."""
    status = answer["status"]
    if status == "ok":
        return "ok"
    if status == "error":
        return answer["class"]
    if status == "died":
        return f"died {answer['signal']}"
    return status


def _compared(answer: dict) -> str:
    """What two legs must have in common: ``ok``, or the error's class among
    the direct subclasses of CoralRTError (a SegmentFormatError is a ModelError)."""
    if answer["status"] == "error" and len(answer["family"]) >= 2:
        return answer["family"][-2]
    return outcome(answer)


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _output_difference(a, b, lsb: int) -> str | None:
    if isinstance(a, tuple) or isinstance(b, tuple):   # digests of large outputs
        return None if a == b else "digests of the large output differ"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.kind in "iu":
        diff = np.abs(a.astype(np.int64) - b.astype(np.int64))
        worst = int(diff.max()) if diff.size else 0
        return None if worst <= lsb else (
            f"{int(np.count_nonzero(diff > lsb))} of {diff.size} {a.dtype} values differ by "
            f"more than {lsb} (up to {worst})")
    if a.dtype.kind == "f":
        x, y = a.astype(np.float64), b.astype(np.float64)
        nan_a, nan_b = np.isnan(x), np.isnan(y)
        if not np.array_equal(nan_a, nan_b):
            return f"NaN at {int(np.count_nonzero(nan_a != nan_b))} places on one side only"
        finite = np.isfinite(y) & np.isfinite(x)
        span = float(np.abs(y[finite]).max()) if finite.any() else 0.0
        close = np.isclose(x, y, rtol=FLOAT_RTOL, atol=FLOAT_RTOL * max(span, 1e-30))
        close |= nan_a & nan_b
        return None if close.all() else (
            f"{int(np.count_nonzero(~close))} of {x.size} {a.dtype} values differ by more "
            f"than {FLOAT_RTOL:g} relative (largest difference "
            f"{float(np.nanmax(np.abs(x - y)[~close])):.6g})")
    return None if np.array_equal(a, b) else f"{a.dtype} values differ"


def _outputs_problem(leg: str, ref: str, a: dict, b: dict, default_lsb: int) -> Problem | None:
    if a.get("inputs") != b.get("inputs"):
        return Problem((leg, ref), "outputs", f"inputs differ: {a['inputs']} vs {b['inputs']}")
    names_a = [n for n, _ in a["outputs"]]
    names_b = [n for n, _ in b["outputs"]]
    if names_a != names_b:
        return Problem((leg, ref), "outputs", f"output names differ: {names_a} vs {names_b}")
    lsb = default_lsb if "litert-default" in (leg, ref) else 0
    for (name, x), (_, y) in zip(a["outputs"], b["outputs"]):
        why = _output_difference(x, y, lsb)
        if why:
            return Problem((leg, ref), "outputs", f"output {name!r}: {why}")
    return None


def check(answers: dict, default_lsb: int | None = None) -> list[Problem]:
    """What is wrong with one case's answers (``{leg: answer}``); empty when nothing is.
    ``default_lsb`` replaces :data:`DEFAULT_LSB` (a deep model's drift)."""
    problems = []
    live = {}
    for leg, a in answers.items():
        if a["status"] in ("died", "hang", "raw"):
            problems.append(Problem((leg,), outcome(a), _first_line(a["message"], 1500)))
        elif declined(leg, a):
            continue
        else:
            live[leg] = a
    if len({_compared(a) for a in live.values()}) > 1:
        problems.append(Problem(tuple(live), "disagree", "; ".join(
            f"{leg}: {outcome(a)}" + (f" ({_first_line(a['message'], 200)})"
                                      if a["status"] != "ok" else "")
            for leg, a in live.items())))
    elif live and all(a["status"] == "ok" for a in live.values()):
        # The yardstick: the reference kernels, else the first leg bit-exact against them.
        order = ("litert-reference", "numpy", "sim", "litert-default")
        ref = min(live, key=lambda leg: order.index(leg) if leg in order else len(order))
        for leg in live:
            if leg != ref:
                p = _outputs_problem(leg, ref, live[leg], live[ref],
                                     DEFAULT_LSB if default_lsb is None else default_lsb)
                if p:
                    problems.append(p)
    return problems
