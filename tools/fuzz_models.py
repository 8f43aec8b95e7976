"""Long fuzzing campaign for the model layer (the CI test runs a short one).

Mutates real models and runs each through validation, the target's load and
one inference in a long-lived worker subprocess.  Mutation kinds: ``bytes``
(truncation and byte flips), ``minus_one`` (an operator input set to -1,
"omitted") and ``swap`` (an operator input rewired to another tensor of its
subgraph).  Cases that crash, hang or escape as a raw traceback are saved for
inspection; the summary counts the outcomes per kind.

    python tools/fuzz_models.py --cases 50000 --seed 1 --save /tmp/crashes
    python tools/fuzz_models.py --kinds minus_one,swap --target sim --cases 2000
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from test_model_fuzz import INPUT_MUTATIONS, SEEDS, Worker, mutate_operator_input  # noqa: E402

from conftest import MODELS_DIR  # noqa: E402

EXTRA = ["mobilenet_v1_0.25_128_quant.tflite", "deeplabv3_mnv2_dm05_pascal_quant.tflite"]
KINDS = ("bytes", *INPUT_MUTATIONS)
BAD = ("DIED", "HANG", "RAW")


def _flip_bytes(data: bytes, rnd: random.Random) -> bytes:
    out = bytearray(data)
    if rnd.random() < 0.3:
        out = out[: rnd.randrange(len(out))]
    for _ in range(rnd.randint(1, 8)):
        if out:
            out[rnd.randrange(len(out))] = rnd.randrange(256)
    return bytes(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma-separated mutation kinds, from {', '.join(KINDS)}")
    ap.add_argument("--target", default="cpu", choices=("cpu", "sim"))
    ap.add_argument("--save", type=Path, default=Path(tempfile.gettempdir()) / "coralrt-fuzz")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        ap.error(f"--kinds takes {', '.join(KINDS)}")
    rnd = random.Random(args.seed)
    originals = {n: (MODELS_DIR / n).read_bytes() for n in [*SEEDS, *EXTRA]}
    worker, counts = Worker(), collections.Counter()
    args.save.mkdir(parents=True, exist_ok=True)
    case_path = args.save / "current.tflite"
    for i in range(args.cases):
        name = rnd.choice(sorted(originals))
        kind = rnd.choice(kinds)
        if kind == "bytes":
            data = _flip_bytes(originals[name], rnd)
        else:
            data = mutate_operator_input(originals[name], kind, rnd.randrange)
            if data is None:
                continue
        case_path.write_bytes(data)
        answer = worker.ask(case_path, args.target)
        outcome = answer.split(" ", 1)[0]
        counts[kind, outcome] += 1
        if outcome in BAD:
            kept = args.save / f"{name}.{kind}.{args.seed}.{i}.tflite"
            case_path.rename(kept)
            print(f"case {i} ({kind} {name}): {answer[:200]} -> {kept}", flush=True)
    worker.close()
    for kind in kinds:
        row = {o: n for (k, o), n in sorted(counts.items()) if k == kind}
        print(f"{kind}: {sum(row.values())} cases: {row}")
    return 1 if any(o in BAD for _, o in counts) else 0


if __name__ == "__main__":
    sys.exit(main())
