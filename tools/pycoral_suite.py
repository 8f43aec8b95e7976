"""Run Google's pycoral unit tests and examples, unchanged, on coralrt's simulated Edge TPU.

    CORALRT_PYCORAL_DIR=~/src/pycoral CORALRT_CORAL_TEST_DATA=~/src/test_data \\
        python tools/pycoral_suite.py [--only NAME] [--stand-ins] [--timeout S]

``CORALRT_PYCORAL_DIR`` is a checkout of google-coral/pycoral (its ``tests/`` and
``examples/``), ``CORALRT_CORAL_TEST_DATA`` Coral's ``test_data`` folder.  With
either unset the run is skipped (exit status 0) and says why.

Each test module runs in its own process, from the test data folder, as
``python -m coralrt.compat --target sim -m unittest -v tests.NAME_test`` with the
checkout on ``PYTHONPATH`` and the test data folder in ``CORALRT_PLAIN_MODELS``
(so a compiled ``X_edgetpu.tflite`` runs its plain ``X.tflite`` on the simulator).
Each example runs as ``python -m coralrt.compat --target sim examples/NAME.py
ARGS`` (tools/pycoral_examples.py).  An error whose cause is a file absent from
the test data folder counts as "missing data", not as a failure
(tools/pycoral_outcomes.py).  ``--stand-ins`` adds a second pass, reported apart,
of the modules and examples that open a file the folder lacks and that a stand-in
model replaces (tools/pycoral_standins.py).

Exit status: 1 when a test or example whose files exist failed, else 0; 2 for
a usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pycoral_examples as ex  # noqa: E402
import pycoral_outcomes as oc  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
PYCORAL_DIR, TEST_DATA = "CORALRT_PYCORAL_DIR", "CORALRT_CORAL_TEST_DATA"
MODULES = ("classify", "detect", "segment", "edgetpu_utils", "pipelined_model_runner",
           "multiple_tpus", "imprinting_engine", "imprinting_evaluation", "softmax_regression")
_WHAT = {PYCORAL_DIR: "a checkout of google-coral/pycoral, with its tests/ and examples/",
         TEST_DATA: "Coral's test_data folder (google-coral/test_data)"}


@dataclass
class Result:
    """One module or example: its table row and what to list under it."""
    name: str
    verdicts: list = field(default_factory=list)     # oc.Verdict per test
    seconds: float = 0.0
    note: str = ""                                    # an example's outcome in words
    status: str = ""                                  # an example's status
    stand_ins: list = field(default_factory=list)

    def count(self, status: str) -> int:
        if self.status:
            return int(self.status == status)
        return sum(v.status == status for v in self.verdicts)


def _env(data: Path, work: Path, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CORALRT_COMPAT", "CORALRT_TARGET", "PYTHONPATH")}
    env["CORALRT_PLAIN_MODELS"] = str(data)
    env["TMPDIR"] = str(work)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float, log: Path):
    """(exit status or None on a timeout, stdout, stderr); both kept in ``log``.*"""
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)         # the child and what it started
        out, err = proc.communicate()
        code = None
    log.with_suffix(".stdout").write_text(out)
    log.with_suffix(".stderr").write_text(err)
    return code, out, err


def _compat(*program: str) -> list[str]:
    return [sys.executable, "-m", "coralrt.compat", "--target", "sim", *program]


def run_module(name: str, pycoral: Path, data: Path, work: Path, timeout: float,
               stand_ins: list[str]) -> Result:
    tmp = work / "tmp" / name
    tmp.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    code, _, err = _run(_compat("-m", "unittest", "-v", f"tests.{name}_test"), data,
                        _env(data, tmp, str(pycoral)), timeout, work / "logs" / name)
    parsed = oc.parse(err)
    tests = list(parsed.tests.values())
    if parsed.ran is None or code is None:
        why = (f"timed out after {timeout:.0f} s" if code is None
               else f"the run ended with status {code} before unittest's summary")
        tail = "\n".join(err.splitlines()[-15:])
        tests.append(oc.Test("(run)", f"tests.{name}_test",
                             {"": oc.Unit("ERROR", traceback=f"RunError: {why}\n{tail}")}))
    verdicts = [oc.classify(t, data, stand_in_module=bool(stand_ins)) for t in tests]
    return Result(name, verdicts, time.monotonic() - start, stand_ins=stand_ins)


def run_example(example: ex.Example, pycoral: Path, data: Path, work: Path, timeout: float,
                overlay=None) -> Result | None:
    folder = work / "examples" / example.name
    folder.mkdir(parents=True, exist_ok=True)
    files = ex.Files(data, folder)
    result = Result(example.name)
    try:
        args = example.args(files)
    except ex.Missing as e:
        if overlay is not None:
            return None
        result.status, result.note = oc.MISSING, f"absent: {e}"
        return result
    result.stand_ins = sorted({str(p.relative_to(files.data)) for p in files.used
                               if overlay is not None and overlay.is_stand_in(p)})
    if overlay is not None and not result.stand_ins:
        return None                                  # the ordinary pass covers it
    start = time.monotonic()
    script = pycoral / "examples" / f"{example.name}.py"
    code, out, err = _run(_compat(str(script), *args), folder, _env(data, folder, None),
                          timeout, work / "logs" / f"example_{example.name}")
    result.seconds = time.monotonic() - start
    if code != 0:
        exc = oc.final_exception(err) if code is not None else f"timed out after {timeout:.0f} s"
        absent = oc.missing_file(exc, data) if code is not None else None
        result.status = oc.MISSING if absent else oc.FAILED
        result.note = f"absent: {absent}" if absent else f"exit status {code}: {exc}"
        return result
    try:
        result.status, result.note = oc.PASSED, example.check(out, files, args)
    except ex.CheckFailed as e:
        result.status = oc.DIFFERS if result.stand_ins else oc.FAILED
        result.note = str(e)
    return result


# -- the report ----------------------------------------------------------------------------


def _table(title: str, results: list[Result], statuses) -> None:
    print(f"\n{title}")
    width = max([len(r.name) for r in results] + [6])
    head = "  ".join(f"{s:>{max(len(s), 6)}}" for s in statuses)
    print(f"  {'':<{width}}  {head}  {'seconds':>7}")
    for r in results + [_total(results)]:
        cells = "  ".join(f"{r.count(s):>{max(len(s), 6)}}" for s in statuses)
        print(f"  {r.name:<{width}}  {cells}  {r.seconds:>7.1f}")


def _total(results: list[Result]) -> Result:
    total = Result("total", seconds=sum(r.seconds for r in results))
    total.verdicts = [v for r in results for v in r.verdicts]
    total.verdicts += [oc.Verdict(None, r.status, [], []) for r in results if r.status]
    return total


def _short(text: str, lines: int = 12) -> str:
    rows = [ln[:600] for ln in text.splitlines()]
    return "\n".join(rows[:lines] + ([f"[{len(rows) - lines} more lines]"] if len(rows) > lines
                                     else []))


def _details(results: list[Result], data: Path) -> None:
    for wanted, title in ((oc.FAILED, "Failures"), (oc.DIFFERS, "Stand-in differs")):
        shown = [(r, v) for r in results for v in r.verdicts if v.status == wanted]
        if shown:
            print(f"\n{title}:")
        for r, v in shown:
            for sub, message in v.details:
                if message.startswith("skipped: "):
                    continue
                print(f"- {v.test.id}{' ' + sub if sub else ''}")
                print("    " + _short(message).replace("\n", "\n    "))
    missing = {r.name: sorted({str(p.relative_to(data)) if p.is_relative_to(data) else str(p)
                               for v in r.verdicts for p in v.missing}) for r in results}
    if any(missing.values()):
        print("\nMissing data (files absent from the test data folder):")
        for name, paths in missing.items():
            if paths:
                print(f"- {name}: {', '.join(paths)}")
    skips = [(v.test.id, m) for r in results for v in r.verdicts if v.status == oc.SKIPPED
             for _, m in v.details]
    if skips:
        print("\nSkipped:")
        for test_id, message in skips:
            print(f"- {test_id}: {message[len('skipped: '):]}")


def _examples_report(results: list[Result]) -> None:
    width = max([len(r.name) for r in results] + [6])
    for r in results:
        print(f"  {r.name:<{width}}  {r.status:<16}  {r.seconds:>6.1f} s  {_short(r.note, 6)}")


def _opens(source: str, name: str) -> bool:
    """Whether a test module's ``source`` names the file ``name``: literally, or by a
    %-format string such as ``'mobilenet_v1_%s_%d_quant_edgetpu.tflite'``."""
    if name in source:
        return True
    for literal in re.findall(r"'([^'\n]*%[sd][^'\n]*)'|\"([^\"\n]*%[sd][^\"\n]*)\"", source):
        text = literal[0] or literal[1]
        pattern = "".join(r"\d+" if part == "%d" else r"[^/]+?" if part == "%s" else re.escape(part)
                          for part in re.split(r"(%[sd])", text))
        if re.fullmatch(pattern, name) or re.fullmatch(pattern, Path(name).name):
            return True
    return False


def run_pass(args, pycoral: Path, data: Path, work: Path, overlay=None) -> bool:
    """One pass over the modules and examples; True when something failed."""
    label = "with stand-ins" if overlay is not None else "on the test data"
    modules = []
    for name in MODULES:
        if args.only and name not in args.only:
            continue
        source = (pycoral / "tests" / f"{name}_test.py").read_text(errors="replace")
        used = [s for s in overlay.made if _opens(source, s)] if overlay is not None else []
        if overlay is None or used:
            modules.append((name, used))
    chosen = [e for e in ex.EXAMPLES if not args.only or e.name in args.only]
    print(f"\n== pycoral on coralrt (target sim), {label}: {data}", flush=True)
    module_results, example_results = [], []
    for i, (name, used) in enumerate(modules, 1):
        print(f"[{i}/{len(modules)}] tests.{name}_test ...", end=" ", flush=True)
        r = run_module(name, pycoral, data, work, args.timeout, used)
        print(", ".join(f"{s} {r.count(s)}" for s in oc.STATUSES if r.count(s))
              + f" ({r.seconds:.1f} s)", flush=True)
        module_results.append(r)
    for i, example in enumerate(chosen, 1):
        r = run_example(example, pycoral, data, work, args.timeout, overlay)
        if r is not None:
            print(f"[example {i}/{len(chosen)}] {example.name}: {r.status} "
                  f"({r.seconds:.1f} s)", flush=True)
            example_results.append(r)
    statuses = oc.STATUSES if overlay is not None else oc.STATUSES[:-1]
    if module_results:
        _table(f"pycoral tests, {label}:", module_results, statuses)
        if overlay is not None:
            for r in module_results:
                print(f"  {r.name} opens stand-ins: {', '.join(r.stand_ins)}")
        _details(module_results, data)
    if example_results:
        print(f"\npycoral examples, {label}:")
        _examples_report(example_results)
    print(f"\nLogs: {work / 'logs'}")
    return any(r.count(oc.FAILED) for r in module_results + example_results)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pycoral-dir", type=Path, default=os.environ.get(PYCORAL_DIR) or None,
                   help=f"{_WHAT[PYCORAL_DIR]} (default: ${PYCORAL_DIR})")
    p.add_argument("--test-data", type=Path, default=os.environ.get(TEST_DATA) or None,
                   help=f"{_WHAT[TEST_DATA]} (default: ${TEST_DATA})")
    p.add_argument("--only", action="append", metavar="NAME",
                   choices=list(MODULES) + [e.name for e in ex.EXAMPLES],
                   help="run only this test module or example (repeatable)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds for each module or example (default 1800)")
    p.add_argument("--stand-ins", action="store_true",
                   help="then run what opens a missing file again, with stand-in models")
    p.add_argument("--shared-models", type=Path, default=REPO_ROOT.parent / "shared" / "models",
                   help="another folder of source models for stand-ins (default ../shared/models)")
    p.add_argument("--work", type=Path, help="folder for logs and outputs (default: a new "
                   "temporary folder, kept)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    unset = [(name, what) for (name, what), value in
             zip(_WHAT.items(), (args.pycoral_dir, args.test_data)) if value is None]
    if unset:
        print("pycoral suite skipped: " + "; ".join(f"{n} is not set ({w})" for n, w in unset))
        return 0
    pycoral, data = args.pycoral_dir.absolute(), args.test_data.absolute()
    for path, what in ((pycoral / "tests", "tests"), (pycoral / "examples", "examples"),
                       (data, "test data")):
        if not path.is_dir():
            print(f"pycoral suite: no {what} folder at {path}", file=sys.stderr)
            return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="coralrt-pycoral-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    failed = run_pass(args, pycoral, data, work)
    if args.stand_ins:
        from pycoral_standins import build_overlay
        overlay = build_overlay(data, Path(tempfile.mkdtemp(prefix="stand-ins-", dir=work)),
                                args.shared_models)
        print(f"\nStand-ins ({overlay.root / 'STAND-INS.md'}):")
        for name, how in {**overlay.made, **overlay.not_made}.items():
            print(f"- {name}: {how if name in overlay.made else 'not made: ' + how}")
        failed |= run_pass(args, pycoral, overlay.root, work / "stand-in-run", overlay)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
