"""Differential fuzzing campaign over coralrt's ways of running a model.

Mutates models (``tests/support/fuzz_cases.py``: bytes, operator rewiring,
zero points, scales, tensor types, int32 constants) and runs each case on every leg: LiteRT's
default and reference kernels, the NumPy backend and the simulated Edge TPU,
each in its own child process (``tests/support/fuzz_legs.py``), on the same
seeded inputs.  A case fails when a leg dies, hangs or raises something that
is not a coralrt error, or when the legs disagree (different outputs, or one
runs what another refuses).  Prints the outcomes per leg, the failures per
mutation kind and each distinct failure once; saves one reproducer per
distinct failure (the model, and a .txt with every leg's answer).

    python tools/fuzz_models.py --cases 3000 --seed 1 --save /tmp/fuzz-findings
    python tools/fuzz_models.py --seed 0 --case 17 --models built:conv_uint8 --kinds scale
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from support.fuzz_cases import BUILT, EXTRA, KINDS, SEEDS, SLOW, make_case  # noqa: E402
from support.fuzz_legs import Legs, available_legs, check, declined, outcome  # noqa: E402

MODEL_SETS = {"test": (*SEEDS, *BUILT), "all": (*SEEDS, *BUILT, *EXTRA),
              "slow": (*SEEDS, *BUILT, *EXTRA, *SLOW)}
#: LiteRT's default kernels round differently layer after layer: on a deep
#: network the difference to the reference kernels grows with depth (up to
#: 7 LSB on MobileNet's uint8 softmax with random inputs, over 8 input seeds).
DEFAULT_LSB_BY_MODEL = {"mobilenet_v1_0.25_128_quant.tflite": 16}


def signature(problem, case) -> tuple:
    """What makes two failures the same: the legs, what went wrong, the
    mutation kind, the operators involved and the message without numbers."""
    msg = problem.message
    if problem.kind.startswith("died"):
        lines = [ln for ln in msg.split(": ", 1)[-1].split("\n") if ln.strip()]
        checks = [ln for ln in lines if re.search(r"Check failed|ERROR|corrupt|assert", ln)]
        msg = (checks or lines or [""])[0]
    elif problem.kind == "raw":
        msg = msg.strip().split("\n")[-1]
    elif problem.kind == "disagree":
        # The outcomes, and where in LiteRT a refusal came from.
        where = re.search(r"tflite/\S+:\d+ [^.(]*", msg)
        msg = "; ".join(part.split(" (")[0] for part in msg.split("; ")) + \
            (f" [{where.group(0).strip()}]" if where else "")
    elif problem.kind == "outputs":
        msg = re.sub(r"output '[^']*'", "output", msg)
    msg = re.sub(r"\d+", "N", msg)[:200]
    return (problem.legs, problem.kind, case.kind, case.mutation.ops, msg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case", type=int, help="run this one case only, and print every answer")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated mutation kinds, from {', '.join(KINDS)}")
    ap.add_argument("--models", default="all",
                    help="comma-separated model names, or a set: 'test' (the short run's), "
                         "'all' (those and MobileNet, the default), 'slow' (and DeepLab)")
    ap.add_argument("--legs", default=",".join(available_legs()),
                    help="comma-separated legs (default: every installed one)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case and leg")
    ap.add_argument("--save", type=Path, default=Path(tempfile.gettempdir()) / "coralrt-fuzz")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        ap.error(f"--kinds takes {', '.join(KINDS)}")
    models = MODEL_SETS.get(args.models) or tuple(m for m in args.models.split(",") if m)
    legs = [leg for leg in args.legs.split(",") if leg]
    if set(legs) - set(available_legs()):
        ap.error(f"--legs takes {', '.join(available_legs())}")
    indices = [args.case] if args.case is not None else range(args.cases)
    args.save.mkdir(parents=True, exist_ok=True)
    case_path = args.save / "current.tflite"
    per_leg = collections.Counter()
    per_kind = collections.Counter()
    found: dict[tuple, list] = {}
    start = time.monotonic()
    with Legs(legs, args.timeout) as runner:
        for i in indices:
            case = make_case(args.seed, i, models, kinds)
            if case is None:
                per_kind[("(no mutation)", "-")] += 1
                continue
            case_path.write_bytes(case.mutation.data)
            answers = runner.run(case_path, case.input_seed)
            problems = check(answers, DEFAULT_LSB_BY_MODEL.get(case.model))
            for leg, a in answers.items():
                per_leg[leg, "declined" if declined(leg, a) else outcome(a)] += 1
            per_kind[case.kind, "failed" if problems else "passed"] += 1
            if args.case is not None:
                print(f"{case.model} {case.kind}: {case.mutation.what}")
                for leg, a in answers.items():
                    print(f"  {leg}: {outcome(a)} {str(a.get('message', ''))[:500]}")
            for p in problems:
                sig = signature(p, case)
                if sig not in found:
                    found[sig] = [case, p, 0]
                    model = case.model.replace(":", "_").removesuffix(".tflite")
                    stem = f"{len(found):03d}-{model}-{case.kind}-{args.seed}-{i}"
                    (args.save / f"{stem}.tflite").write_bytes(case.mutation.data)
                    (args.save / f"{stem}.txt").write_text(
                        f"{case.model}, {case.kind}: {case.mutation.what}\n"
                        f"reproduce: {case.reproduce()}\n{p}\n\n" + "\n".join(
                            f"{leg}: {outcome(a)}: {a.get('message', '')}"
                            for leg, a in answers.items()) + "\n")
                    print(f"case {i}: NEW {p.kind} [{'/'.join(p.legs)}] {case.model} "
                          f"{case.kind}: {case.mutation.what}\n    {str(p)[:400]}\n"
                          f"    -> {args.save / stem}.tflite", flush=True)
                found[sig][2] += 1
    print(f"\n{len(indices)} cases in {time.monotonic() - start:.0f} s "
          f"(seed {args.seed}, legs {', '.join(legs)})")
    for leg in legs:
        row = {o: n for (lg, o), n in sorted(per_leg.items()) if lg == leg}
        print(f"  {leg}: {row}")
    for kind in sorted({k for k, _ in per_kind}):
        row = {o: n for (k, o), n in sorted(per_kind.items()) if k == kind}
        print(f"  {kind}: {row}")
    print(f"{len(found)} distinct failures:")
    for (legs_, what, kind, ops, msg), (case, p, n) in found.items():
        print(f"  {n:5d} x [{'/'.join(legs_)}] {what} {kind} {','.join(ops) or '-'}: {msg}\n"
              f"          first: {case.reproduce()}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
