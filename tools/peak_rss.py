#!/usr/bin/env python3
"""Peak resident memory of LiteRT and of coralrt's simulated Edge TPU on one model.

Each measurement runs in its own fresh subprocess of this same interpreter and
reports that process's peak RSS (VmHWM from /proc/self/status, or ru_maxrss
where /proc is missing):

* baseline: only imports numpy, coralrt and ai_edge_litert (the import cost
  every other row also pays);
* litert:   the imports, then a one-thread LiteRT Interpreter (default
  kernels) loads the model and runs K inferences;
* sim:      the imports, then ``InferenceSession(model, target="sim",
  num_threads=1)`` loads it and runs K inferences.

The sim session compiles through a private, temporary compile cache that an
unmeasured subprocess fills first, so by default the figures are for loading
a compiled model; ``--cold`` measures the first-ever load (compile included).

    .venv/bin/python tools/peak_rss.py                       # shared MobileNet v2
    .venv/bin/python tools/peak_rss.py path/to/model.tflite --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO_ROOT.parent / "shared" / "models" / "mobilenet_v2_1.0_224_quant.tflite"

# Run in the child: argv = [model, runs].  Prints one JSON line.
_PRELUDE = r"""
import json, resource, sys
import numpy as np
import coralrt
import ai_edge_litert.interpreter

def peak_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "VmHWM"
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss * (1 if sys.platform == "darwin" else 1024), "ru_maxrss"

def random_input(shape, dtype, rng):
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, endpoint=True).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.standard_normal(shape).astype(dt)

model, runs = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
"""

_CHILDREN = {
    "baseline": "",
    "litert": r"""
from ai_edge_litert.interpreter import Interpreter
interp = Interpreter(model_path=model, num_threads=1)
interp.allocate_tensors()
feeds = [(d["index"], random_input(d["shape"], d["dtype"], rng))
         for d in interp.get_input_details()]
for _ in range(runs):
    for index, value in feeds:
        interp.set_tensor(index, value)
    interp.invoke()
    outs = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
""",
    "sim": r"""
from coralrt import InferenceSession
sess = InferenceSession(model, target="sim", num_threads=1)
feeds = {t.name: random_input(t.shape, t.dtype, rng) for t in sess.get_inputs()}
for _ in range(runs):
    outs = sess.run(feeds)
""",
}
_REPORT = r"""
peak, source = peak_bytes()
print(json.dumps({"peak_bytes": peak, "source": source}))
"""


def measure(kind: str, model: Path, runs: int, env: dict) -> dict:
    """Run one fresh subprocess and return its peak-RSS report."""
    code = _PRELUDE + _CHILDREN[kind] + _REPORT
    proc = subprocess.run([sys.executable, "-c", code, str(model), str(runs)], env=env,
                          capture_output=True, text=True, cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} subprocess failed (exit {proc.returncode}):\n"
                           f"{proc.stderr.strip()}")
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")][-1]
    return json.loads(last)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL,
                        help=f"the .tflite model (default: {DEFAULT_MODEL})")
    parser.add_argument("--runs", type=int, default=10, metavar="K",
                        help="inferences each subprocess runs (default: 10)")
    parser.add_argument("--cold", action="store_true",
                        help="do not pre-fill the compile cache: the sim row includes compiling")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"model not found: {args.model}")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    model = args.model.resolve()

    with tempfile.TemporaryDirectory(prefix="coralrt-peak-rss-") as cache:
        env = dict(os.environ, CORALRT_CACHE_DIR=cache)
        env.pop("CORALRT_CACHE", None)
        if not args.cold:
            measure("sim", model, 1, env)   # fills the compile cache; not reported
        results = {kind: measure(kind, model, args.runs, env)
                   for kind in ("baseline", "litert", "sim")}

    mb = {k: r["peak_bytes"] / 2**20 for k, r in results.items()}
    base = mb["baseline"]
    print(f"peak RSS, {model.name}, {args.runs} inference(s) per process "
          f"({results['baseline']['source']}, fresh subprocess each"
          f"{', sim compiles cold' if args.cold else ''})")
    print(f"{'process':<10} {'peak MB':>9} {'over baseline MB':>17}")
    for kind, label in (("baseline", "imports"), ("litert", "litert"), ("sim", "sim")):
        extra = "" if kind == "baseline" else f"{mb[kind] - base:17.1f}"
        print(f"{label:<10} {mb[kind]:9.1f} {extra}")
    print(f"ratio sim/LiteRT peak RSS: {mb['sim'] / mb['litert']:.2f}")
    lite_extra, sim_extra = mb["litert"] - base, mb["sim"] - base
    if lite_extra > 0:
        print(f"ratio sim/LiteRT over baseline: {sim_extra / lite_extra:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
