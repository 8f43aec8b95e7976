"""Child process of the model fuzzer: runs cases on one leg, each in its own process.

``python -m tests.support.fuzz_worker LEG [TIMEOUT]``: LEG names a way to
run a model (:data:`LEGS`).  The worker imports what the leg needs once (it
runs a tiny model), then reads one case per line on stdin,
``PATH<TAB>INPUT_SEED``, and forks a child per case: the child loads the
model with coralrt on the leg, runs it once on random inputs drawn from
``INPUT_SEED`` (the same inputs on every leg) and hands its answer back.  A
native crash therefore ends only that case's process, and no case can be
hurt by memory an earlier one damaged.  The worker answers each case with one
pickled dict, preceded by its length as an 8-byte little-endian integer, on
the file descriptor that was stdout when it started (stdout itself is sent to
stderr, so that native code printing there cannot garble the answers):

- ``{"status": "ok", "inputs": ..., "outputs": [(name, array or digest)]}``;
- ``{"status": "error", "class": ..., "family": ..., "message": ..., "stage": ...}``
  for a coralrt error (``family``: the classes of :mod:`coralrt.errors` it is;
  ``stage``: ``"validate"`` when coralrt's validation of the file refused it,
  the same on every leg, else ``"session"``);
- ``{"status": "raw", "class": ..., "message": traceback}`` for anything else;
- ``{"status": "died", "signal": ...}`` when the case's process was killed by
  a signal (SIGSEGV, SIGABRT, ...) or exited without answering, and
  ``{"status": "hang"}`` when it did not answer within TIMEOUT seconds
  (default 60; it is then killed).

The path ``ABORT`` makes the case's process abort (tests of the fuzzer itself).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import select
import signal
import struct
import sys
import time
import traceback

import numpy as np

#: leg name -> InferenceSession keyword arguments.  The sim leg partitions in
#: compat mode (every operator the Edge TPU has goes to the simulated Edge TPU,
#: whatever the round trip costs) and runs its CPU steps on the reference
#: kernels, so that all of it is bit-exact against LiteRT's reference kernels.
LEGS = {
    "litert-default": {"target": "cpu", "backend": "litert"},
    "litert-reference": {"target": "cpu", "backend": "litert", "cpu_kernels": "reference"},
    "numpy": {"target": "cpu", "backend": "numpy"},
    "sim": {"target": "sim", "partition_mode": "compat", "cpu_kernels": "reference"},
}
#: Output arrays above this many bytes are answered by their digest only.
MAX_OUTPUT_BYTES = 32 << 20


def feeds(session, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for info in session.get_inputs():
        shape = tuple(int(d) for d in info.shape)
        if np.prod(shape, dtype=np.float64) > 2**24:
            # Mutated shapes can be huge but legal: random data would only cost time.
            out.append(np.zeros(shape, info.dtype))
        elif info.dtype.kind in "iu":     # every bit pattern equally likely
            n = int(np.prod(shape, dtype=np.int64))
            out.append(np.frombuffer(rng.bytes(n * info.dtype.itemsize), info.dtype)
                       .reshape(shape).copy())
        elif info.dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(bool))
        else:
            out.append(rng.standard_normal(shape).astype(info.dtype))
    return out


def _packed(name: str, a) -> tuple:
    a = np.asarray(a)
    if a.nbytes > MAX_OUTPUT_BYTES:
        return name, ("digest", a.dtype.str, a.shape,
                      hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    return name, a


def run_case(options: dict, path: str, seed: int) -> dict:
    from coralrt import InferenceSession
    from coralrt import errors
    from coralrt._model import load_model

    inputs = None
    stage = "validate"
    try:
        load_model(path)
        stage = "session"
        session = InferenceSession(path, num_threads=1, **options)
        inputs = [(str(i.dtype), tuple(int(d) for d in i.shape)) for i in session.get_inputs()]
        result = session.run(feeds(session, seed))
        return {"status": "ok", "inputs": inputs,
                "outputs": [_packed(k, v) for k, v in result.items()]}
    except errors.CoralRTError as e:
        family = [c.__name__ for c in type(e).__mro__
                  if c.__module__ == errors.__name__ and issubclass(c, errors.CoralRTError)]
        return {"status": "error", "class": type(e).__name__, "family": family,
                "message": str(e), "stage": stage, "inputs": inputs}
    except Exception as e:
        return {"status": "raw", "class": type(e).__name__, "message": traceback.format_exc(),
                "stage": stage, "inputs": inputs}


def _serve_one(options: dict, path: str, seed: int, timeout: float) -> dict:
    """Run one case in a forked child and return its answer, or how it ended."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: one case, then out
        os.close(r)
        try:
            if path == "ABORT":
                os.abort()
            with os.fdopen(w, "wb") as out:
                out.write(pickle.dumps(run_case(options, path, seed)))
        finally:
            os._exit(0)
    os.close(w)
    data, deadline, hung = b"", time.monotonic() + timeout, False
    while True:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            hung = True
            break
        chunk = os.read(r, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if hung:
        return {"status": "hang", "message": f"no answer within {timeout:g} s"}
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return {"status": "died", "signal": name, "message": f"the case's process died ({name})"}
    if os.WEXITSTATUS(status) or not data:
        code = os.WEXITSTATUS(status)
        return {"status": "died", "signal": f"exit status {code}",
                "message": f"the case's process exited with status {code} without an answer"}
    return pickle.loads(data)


def _warm_up(options: dict) -> None:
    """Import and register what the leg uses, so that each forked child starts
    ready; runs a tiny model once (no thread is left behind: one CPU thread)."""
    import tempfile

    from coralrt.testing import build_demo_model

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "warm.tflite")
        with open(path, "wb") as f:
            f.write(build_demo_model().to_bytes())
        run_case(options, path, 0)


def main() -> None:
    options = LEGS[sys.argv[1]]
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _warm_up(options)
    for line in sys.stdin:
        path, _, seed = line.rstrip("\n").partition("\t")
        answer = pickle.dumps(_serve_one(options, path, int(seed or 0), timeout))
        answers.write(struct.pack("<Q", len(answer)) + answer)
        answers.flush()


if __name__ == "__main__":
    main()
