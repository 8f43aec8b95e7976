"""Run compiled models through LiteRT with Google's Edge TPU delegate, in a child process.

Started by the libedgetpu tests with ``LD_LIBRARY_PATH`` naming the test libusb
first, so that the delegate talks to a simulated stick:

    python litert_child.py LIBRARY OUT_DIR MODEL [MODEL ...]

loads the delegate from LIBRARY once (libedgetpu's defaults: no options but the
device, ``usb``), then for each MODEL builds an interpreter, fills every input
with the bytes of :func:`inputs` (a fixed pattern, the same the tests give
coralrt), invokes it twice (first run, warm run) and saves the outputs as
``OUT_DIR/<i>_<run>_<output>.npy``.  One JSON line per step goes to stdout
(``{"step": ..., ...}``) so that the parent can tell how far it got if the
child is killed.  A model the delegate or LiteRT refuses is reported
(``"step": "refused"``, with the error: at ``allocate_tensors`` or at
``invoke``) and the next one runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def inputs(details) -> list[np.ndarray]:
    """One array per input: bytes 0, 7, 14, ... (mod 251), viewed as the input's dtype."""
    out = []
    for d in details:
        n = int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize
        raw = (np.arange(n, dtype=np.int64) * 7 % 251).astype(np.uint8)
        out.append(raw.view(d["dtype"]).reshape(d["shape"]))
    return out


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str]) -> int:
    library, out_dir, models = argv[0], Path(argv[1]), argv[2:]
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    start = time.monotonic()
    delegate = load_delegate(library, {"device": "usb"})
    say(step="delegate", seconds=round(time.monotonic() - start, 3))
    for i, model in enumerate(models):
        t0 = time.monotonic()
        try:
            interp = Interpreter(model_path=model, experimental_delegates=[delegate])
            interp.allocate_tensors()
        except Exception as e:      # the delegate or LiteRT refused the model
            say(step="refused", model=model, error=f"{type(e).__name__}: {e}")
            continue
        feed = inputs(interp.get_input_details())
        for run in ("first", "warm"):
            for d, arr in zip(interp.get_input_details(), feed):
                interp.set_tensor(d["index"], arr)
            try:
                interp.invoke()
            except RuntimeError as e:   # the delegate refused to run the program
                say(step="refused", model=model, error=f"{type(e).__name__}: {e}")
                break
            for j, d in enumerate(interp.get_output_details()):
                np.save(out_dir / f"{i}_{run}_{j}.npy", interp.get_tensor(d["index"]))
            say(step=run, model=model, seconds=round(time.monotonic() - t0, 3))
        del interp
    del delegate
    say(step="closed", seconds=round(time.monotonic() - start, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
