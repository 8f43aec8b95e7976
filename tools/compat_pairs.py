"""Check compat-mode partitioning against edgetpu_compiler on plain/compiled model pairs.

Finds every ``X.tflite`` + ``X_edgetpu.tflite`` under the folders (the compiled
file next to the plain one, or in an ``edgetpu/`` subfolder of its folder),
derives from the compiled model which operators edgetpu_compiler mapped to the
Edge TPU, partitions the plain model in compat mode and prints, per pair,
whether the two agree, both Edge TPU operator counts and every operator placed
differently, with compat mode's reason and why the two disagree (coralrt's
reason for each operator it keeps on the CPU that edgetpu_compiler mapped, and
what lets it map each one edgetpu_compiler left on the CPU).

    python tools/compat_pairs.py ../shared/models
    python tools/compat_pairs.py DIR1 DIR2 --json

Exit status: 0 when every pair agrees, 1 when a pair disagrees or cannot be
compared, 2 for a usage error (including no pair found).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coralrt._compile.pairs import compare_pair, find_pairs  # noqa: E402


def _short(path: str, roots: list[Path]) -> str:
    p = Path(path).resolve()
    for root in roots:
        try:
            return str(p.relative_to(root.resolve().parent))
        except ValueError:
            continue
    return path


def _print(reports, unpaired, roots, verbose: bool) -> None:
    for r in reports:
        name = _short(r.plain, roots)
        if r.error:
            print(f"ERROR     {name}: {r.error}")
            continue
        status = "agree" if r.agree else "disagree"
        print(f"{status:<9} {name}: Edge TPU operators edgetpu_compiler "
              f"{r.compiler_tpu_ops}/{r.total_ops}, compat {r.compat_tpu_ops}/{r.total_ops}"
              f" (Edge TPU subgraphs {r.compiler_segments} vs {r.compat_segments})")
        for note in r.notes:
            print(f"    note: {note}")
        for d in r.diffs:
            print(f"    op {d.index:>4} {d.opcode:<24} edgetpu_compiler: {d.edgetpu_compiler}"
                  f"  compat: {d.compat}  reason: {d.reason}")
            print(f"         why: {d.why}")
    if verbose:
        for path in unpaired:
            print(f"skipped   {_short(str(path), roots)}: no plain model beside it")
    bad = sum(not r.agree for r in reports)
    print(f"{len(reports)} pairs: {len(reports) - bad} agree, {bad} disagree or failed"
          f"; {len(unpaired)} compiled models without a plain model skipped")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="compat_pairs.py", description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="folders searched for pairs")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also list compiled models that have no plain model")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        p.error(f"not a folder: {', '.join(missing)}")
    pairs, unpaired = find_pairs(args.folders)
    if not pairs:
        p.error("no plain/compiled pair found (X.tflite next to X_edgetpu.tflite)")
    reports = [compare_pair(plain, compiled) for plain, compiled in pairs]
    if args.json:
        json.dump({"pairs": [r.to_dict() for r in reports],
                   "unpaired": [str(u) for u in unpaired],
                   "agree": all(r.agree for r in reports)}, sys.stdout, indent=2)
        print()
    else:
        _print(reports, unpaired, args.folders, args.verbose)
    return 0 if all(r.agree for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
