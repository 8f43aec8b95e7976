"""Time a whole model on the simulated Edge TPU's integer kernels against LiteRT.

    python tools/bench_sim_conv.py [model.tflite] [--runs N] [--per-op]

Runs the model as one segment through ``SegmentRunner`` and in the LiteRT
interpreter with the reference kernels (BUILTIN_REF, the yardstick the
simulated kernels reproduce bit for bit) and with its default optimized
kernels, checks the simulated outputs equal the reference ones, and prints
the best-of-N times.  ``--per-op`` adds the time spent per operator type.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import numpy as np

from coralrt._formats.segment import build_segment
from coralrt._model import load_model
from coralrt._sim.runner import SegmentRunner

DEFAULT_MODEL = (Path(__file__).resolve().parents[2] / "shared" / "models"
                 / "mobilenet_v2_1.0_224_quant.tflite")


def _best(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _litert(data: bytes, inputs, reference: bool):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.AUTO
    interp = Interpreter(model_content=data, experimental_op_resolver_type=kind)
    interp.allocate_tensors()
    ins, outs = interp.get_input_details(), interp.get_output_details()

    def run():
        for d, v in zip(ins, inputs):
            interp.set_tensor(d["index"], v)
        interp.invoke()
        return [interp.get_tensor(d["index"]) for d in outs]

    return run


def _per_op(runner: SegmentRunner, inputs, runs: int) -> dict[str, float]:
    totals: dict[str, float] = collections.defaultdict(float)
    for _ in range(runs):
        values = dict(runner._constants)
        values.update(zip(runner._inputs, inputs))
        for (run, ins, outs), op in zip(runner._steps, runner.segment.ops):
            t = time.perf_counter()
            results = run([values[k] if k >= 0 else None for k in ins])
            totals[op.name] += time.perf_counter() - t
            values.update(zip(outs, results))
    return {k: v / runs for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--per-op", action="store_true")
    args = ap.parse_args()

    data = Path(args.model).read_bytes()
    t = time.perf_counter()
    runner = SegmentRunner(build_segment(load_model(data)))
    load = time.perf_counter() - t
    rng = np.random.default_rng(0)
    inputs = []
    for k in runner.segment.inputs:
        tensor = runner.segment.tensors[k]
        info = np.iinfo(np.uint8 if tensor.dtype == 3 else np.int8)
        inputs.append(rng.integers(info.min, info.max + 1, size=tensor.shape)
                      .astype(info.dtype))

    ref = _litert(data, inputs, reference=True)
    fast = _litert(data, inputs, reference=False)
    want = ref()
    got = runner.run(inputs)
    exact = all(np.array_equal(g, w) for g, w in zip(got, want))

    t_sim = _best(lambda: runner.run(inputs), args.runs)
    t_ref = _best(ref, max(1, args.runs // 2))
    t_fast = _best(fast, args.runs)
    print(f"model: {Path(args.model).name}")
    print(f"simulated kernels:      {t_sim * 1e3:8.1f} ms  (load {load * 1e3:.0f} ms, "
          f"{'bit-exact' if exact else 'MISMATCH'} vs BUILTIN_REF)")
    print(f"LiteRT BUILTIN_REF:     {t_ref * 1e3:8.1f} ms  (sim is {t_ref / t_sim:.2f}x faster)")
    print(f"LiteRT default kernels: {t_fast * 1e3:8.1f} ms  (sim is {t_sim / t_fast:.1f}x slower)")
    if args.per_op:
        for name, secs in _per_op(runner, inputs, args.runs).items():
            print(f"  {name:22s} {secs * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
