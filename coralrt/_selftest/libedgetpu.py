"""libedgetpu, Google's own driver, as the yardstick: probed and run in child processes.

Loading a libedgetpu build that does not match this machine (or this
Python's LiteRT) can crash the process that loads it, so this process never
loads it: :func:`probe` loads it in a child, and :func:`run_model` runs a
compiled model with LiteRT and the Edge TPU delegate in a child, exchanging
inputs and outputs through ``.npz`` files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from coralrt._backends.libedgetpu import LIBRARY, PROBE_TIMEOUT
from coralrt._backends.libedgetpu import probe as driver_probe

__all__ = ["LIBRARY", "probe", "run_model"]

_RUN = r"""
import json, sys
import numpy as np
model, library, inputs, outputs = sys.argv[1:5]
try:
    from ai_edge_litert.interpreter import Interpreter, load_delegate
except ImportError:
    from tflite_runtime.interpreter import Interpreter, load_delegate
it = Interpreter(model_path=model, experimental_delegates=[load_delegate(library)])
it.allocate_tensors()
feed = np.load(inputs)
for i, d in enumerate(it.get_input_details()):
    it.set_tensor(d["index"], feed[f"in{i}"])
it.invoke()
out = {f"out{i}": it.get_tensor(d["index"]) for i, d in enumerate(it.get_output_details())}
np.savez(outputs, **out)
print(json.dumps([d["name"] for d in it.get_output_details()]))
"""


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def probe(library: str = LIBRARY, *, timeout: float = PROBE_TIMEOUT) -> dict:
    """Whether ``library`` loads, found out in a child process by the libedgetpu
    driver's own probe (:func:`coralrt._backends.libedgetpu.probe`).

    ``status``: "installed" (the library loads and is an Edge TPU delegate;
    ``delegate`` says whether one could be created now, which needs a free
    stick), "not installed" (with the loader's ``error``), or "unusable" (the
    child crashed, hung, or the library is not libedgetpu: ``error`` says how).
    """
    found = driver_probe(library, timeout=timeout)
    answer = {"library": library, "version": found.version}
    if found.ok or found.stage == "delegate":
        return {**answer, "status": "installed", "delegate": found.ok,
                **({} if found.ok else {"error": found.message})}
    if found.stage in ("dlopen", "no-litert"):
        return {**answer, "status": "not installed", "error": found.message}
    how = {"crash": f"loading it killed the child process ({_signal_name(-(found.signal or 0))})",
           "timeout": f"loading it did not finish within {timeout:g} s"}.get(found.stage)
    return {**answer, "status": "unusable", "error": how or found.message or found.stage}


def run_model(model: Path, inputs: list[np.ndarray], *, library: str = LIBRARY,
              timeout: float = 300.0) -> tuple[list[np.ndarray], list[str]]:
    """The outputs of ``model`` run once by LiteRT with libedgetpu's delegate, in a child.

    Raises RuntimeError with the child's error when it fails or crashes.
    """
    with tempfile.TemporaryDirectory(prefix="coralrt-selftest-") as tmp:
        feed = os.path.join(tmp, "inputs.npz")
        out = os.path.join(tmp, "outputs.npz")
        np.savez(feed, **{f"in{i}": a for i, a in enumerate(inputs)})
        try:
            # The child must load the installed LiteRT and libedgetpu, never coralrt's
            # stand-ins for them (coralrt.compat, which CORALRT_COMPAT=1 installs).
            env = {k: v for k, v in os.environ.items() if k != "CORALRT_COMPAT"}
            proc = subprocess.run([sys.executable, "-c", _RUN, str(model), library, feed, out],
                                  capture_output=True, text=True, timeout=timeout, check=False,
                                  env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"LiteRT with {library} did not finish within {timeout:g} s") \
                from None
        if proc.returncode != 0:
            how = (_signal_name(proc.returncode) if proc.returncode < 0
                   else f"exit status {proc.returncode}")
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"LiteRT with {library} failed ({how}) {tail[0]}".strip())
        names = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(out) as z:
            outputs = [z[f"out{i}"] for i in range(len(names))]
    return outputs, names
