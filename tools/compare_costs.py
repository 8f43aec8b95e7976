#!/usr/bin/env python3
"""Host costs of two (or more) source trees of coralrt, measured in one run.

For a refactoring that must not change behaviour or speed: each tree is
measured in its own subprocess (the tree's ``coralrt`` and ``tests/support``
first on ``sys.path``; an editable install's import hook is taken out of the
way), the trees alternate round by round so that every median sees the same
machine load, and the table prints each figure with its change against the
first tree.

Figures (medians):

* ``sim_mnv2``: one inference of MobileNet v2 (uint8, 224x224) on ``target="sim"``;
* ``session_hit``: creating an ``InferenceSession`` for that model on ``sim``
  when its compiled segments are in the cache (the cache is per tree and warm);
* ``driver_host``: one inference through the USB driver on the simulated stick
  with device time 0 (the DWN1 test mode of ``tests/support/sim.py``), the
  compiled MobileNet v2, parameters cached: the driver's host-side cost.

Usage::

    python tools/compare_costs.py --rounds 5 BEFORE_TREE AFTER_TREE

Needs ``../shared/models`` beside the first tree.  No Coral stick is involved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, os, sys, time, statistics
tree, shared, what, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.meta_path[:] = [f for f in sys.meta_path
                    if "editable" not in str(getattr(f, "__module__", "")).lower()]
sys.path[:0] = [tree, os.path.join(tree, "tests")]
import numpy as np
import coralrt
assert coralrt.__file__.startswith(tree), coralrt.__file__
model = os.path.join(shared, "models", "mobilenet_v2_1.0_224_quant.tflite")
x = np.random.default_rng(0).integers(0, 256, (1, 224, 224, 3), np.uint8)
times = []
if what == "sim_mnv2":
    s = coralrt.InferenceSession(model, target="sim")
    name = s.get_inputs()[0].name
    s.run(None, {name: x})
    for _ in range(n):
        t = time.perf_counter(); s.run(None, {name: x}); times.append(time.perf_counter() - t)
elif what == "session_hit":
    coralrt.InferenceSession(model, target="sim")
    for _ in range(n):
        t = time.perf_counter(); coralrt.InferenceSession(model, target="sim")
        times.append(time.perf_counter() - t)
elif what == "driver_host":
    from coralrt import load_model, open_device
    from support.sim import dwn1_backend
    m = load_model(os.path.join(shared, "models", "edgetpu",
                                "mobilenet_v2_1.0_224_quant_edgetpu.tflite"))
    program = next(op.custom_options for op in m.main.operators if op.name == "edgetpu-custom-op")
    dev = open_device(backend=dwn1_backend())
    try:
        h = dev.load(program)
        inputs = [np.random.default_rng(0).integers(0, 256, l.shape, np.uint8)
                  for l in h.exe.inputs]
        dev.run(h, inputs)
        for _ in range(n):
            t = time.perf_counter(); dev.run(h, inputs); times.append(time.perf_counter() - t)
    finally:
        dev.close()
print(json.dumps(statistics.median(times)))
"""

FIGURES = {"sim_mnv2": 20, "session_hit": 20, "driver_host": 300}


def measure(tree: Path, shared: Path, what: str, n: int, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", WORKER, str(tree), str(shared), what, str(n)],
                         capture_output=True, text=True, env=env, cwd=tree, check=False)
    if out.returncode != 0:
        sys.exit(f"{tree} {what}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="+", type=Path, help="source trees; the first is the baseline")
    p.add_argument("--rounds", type=int, default=5, help="alternations per figure (default 5)")
    p.add_argument("--shared", type=Path, help="the shared folder (default: beside the first tree)")
    args = p.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    shared = (args.shared or trees[0].parent / "shared").resolve()
    results: dict = {(t, w): [] for t in trees for w in FIGURES}
    with tempfile.TemporaryDirectory() as tmp:
        envs = {}
        for i, t in enumerate(trees):
            env = dict(os.environ, CORALRT_CACHE_DIR=f"{tmp}/cache{i}",
                       CORALRT_RUNTIME_DIR=f"{tmp}/run{i}", CORALRT_DISABLE_PLUGIN_AUTOLOAD="1")
            os.makedirs(env["CORALRT_RUNTIME_DIR"])
            envs[t] = env
        for r in range(args.rounds):
            for what, n in FIGURES.items():
                for t in trees:
                    results[(t, what)].append(measure(t, shared, what, n, envs[t]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{'figure':<12} " + " ".join(f"{t.name:>18}" for t in trees))
    for what in FIGURES:
        base = statistics.median(results[(trees[0], what)])
        cells = []
        for t in trees:
            med = statistics.median(results[(t, what)])
            change = "" if t == trees[0] else f" ({(med / base - 1) * 100:+.1f}%)"
            cells.append(f"{med * 1e3:.3f} ms{change}")
        print(f"{what:<12} " + " ".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
