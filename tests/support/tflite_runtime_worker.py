"""Runs in a venv that has tflite-runtime and NumPy 1 but not ai-edge-litert.

Usage: python tflite_runtime_worker.py MODELS_DIR OUT.npz MODEL...
Runs each model on the ``cpu`` target (reference and optimized kernels) and on
``sim`` with the default backend, which must be tflite_runtime here, and saves
every output as ``"<model>|<cpu-reference|cpu-optimized|sim>|<output>"``, plus
``"|meta|backend"`` and ``"|meta|litert_error"``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from coralrt import InferenceSession
from coralrt._backends import get_backend
from coralrt.errors import BackendUnavailableError


def feeds(session) -> list:
    rng = np.random.default_rng(0)
    out = []
    for t in session.get_inputs():
        dt = np.dtype(t.dtype)
        if dt.kind in "iu":
            info = np.iinfo(dt)
            out.append(rng.integers(info.min, info.max, t.shape, endpoint=True).astype(dt))
        else:
            out.append(rng.standard_normal(t.shape).astype(dt))
    return out


def main() -> None:
    models, dest, names = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    saved = {"|meta|backend": np.array(get_backend().name),
             "|meta|numpy": np.array(np.__version__)}
    try:
        get_backend("litert")
        saved["|meta|litert_error"] = np.array("")
    except BackendUnavailableError as e:
        saved["|meta|litert_error"] = np.array(str(e))
    for name in names:
        runs = {"cpu-reference": dict(target="cpu", cpu_kernels="reference"),
                "cpu-optimized": dict(target="cpu", cpu_kernels="optimized"),
                "sim": dict(target="sim")}
        for label, kwargs in runs.items():
            session = InferenceSession(models / name, **kwargs)
            assert session.backend == "tflite_runtime", session.backend
            for out, value in session.run(feeds(session)).items():
                saved[f"{name}|{label}|{out}"] = value
    np.savez(dest, **saved)


if __name__ == "__main__":
    main()
