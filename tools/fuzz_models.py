"""Long fuzzing campaign for the model layer (the CI test runs a short one).

Mutates real models (truncation, byte flips) and runs each through
validation, the CPU backend's load and one inference in a long-lived worker
subprocess.  Cases that crash, hang or escape as a raw traceback are saved
for inspection.

    python tools/fuzz_models.py --cases 50000 --seed 1 --save /tmp/crashes
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

from test_model_fuzz import SEEDS, Worker  # noqa: E402

from conftest import MODELS_DIR  # noqa: E402

EXTRA = ["mobilenet_v1_0.25_128_quant.tflite", "deeplabv3_mnv2_dm05_pascal_quant.tflite"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, default=Path(tempfile.gettempdir()) / "coralrt-fuzz")
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    originals = {n: (MODELS_DIR / n).read_bytes() for n in [*SEEDS, *EXTRA]}
    worker, counts = Worker(), collections.Counter()
    args.save.mkdir(parents=True, exist_ok=True)
    case_path = args.save / "current.tflite"
    for i in range(args.cases):
        name = rnd.choice(sorted(originals))
        data = bytearray(originals[name])
        if rnd.random() < 0.3:
            data = data[: rnd.randrange(len(data))]
        for _ in range(rnd.randint(1, 8)):
            if data:
                data[rnd.randrange(len(data))] = rnd.randrange(256)
        case_path.write_bytes(data)
        answer = worker.ask(case_path)
        kind = answer.split(" ", 1)[0]
        counts[kind] += 1
        if kind in ("DIED", "HANG", "RAW"):
            kept = args.save / f"{name}.{args.seed}.{i}.tflite"
            case_path.rename(kept)
            print(f"case {i} ({name}): {answer[:200]} -> {kept}", flush=True)
    worker.close()
    print(dict(counts))
    return 1 if counts.keys() & {"DIED", "HANG", "RAW"} else 0


if __name__ == "__main__":
    sys.exit(main())
