"""Per-test outcomes from the output of ``python -m unittest -v``, and why a test failed.

:func:`parse` reads what unittest's verbose runner writes to stderr: one line per
test (``test_x (tests.m_test.C.test_x) ... ok``; before Python 3.11 the class
without the method), an indented line per failing subtest
(``  test_x (...) (tpu=True) ... ERROR``), text the test or the runtime printed
in between, and then one block per error or failure (``ERROR: test_x (...)``, a
dashed line, the traceback).  :func:`classify` then tells a failure whose cause
is a model or image file absent from the test data folder ("missing data") from
a real one.

Used by ``tools/pycoral_suite.py``; tested in ``tests/test_pycoral_suite.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Unit", "Test", "Parsed", "Verdict", "parse", "final_exception", "missing_file",
           "missing_files", "classify",
           "PASSED", "FAILED", "MISSING", "SKIPPED", "DIFFERS", "STATUSES"]

PASSED, FAILED, MISSING, SKIPPED, DIFFERS = (
    "passed", "failed", "missing data", "skipped", "stand-in differs")
#: The columns of a table, in order.
STATUSES = (PASSED, FAILED, MISSING, SKIPPED, DIFFERS)

# "test_x (pkg.mod.Class.test_x)" or "test_x (pkg.mod.Class)", then an optional
# subtest description "(tpu=True)" or "[msg] (k=v)".
_ID = r"(?P<name>[A-Za-z_]\w*) \((?P<where>[A-Za-z_]\w*(?:\.\w+)+)\)(?: (?P<sub>[\[(].*?[)\]]))?"
_START = re.compile(r"^(?P<indent>\s*)" + _ID + r"(?P<dots> \.\.\.(?: (?P<rest>.*))?)?$")
_BLOCK = re.compile(r"^(?P<kind>ERROR|FAIL|UNEXPECTED SUCCESS): " + _ID + r"\s*$")
_RULE = re.compile(r"^(=|-){40,}$")
_OUTCOME = re.compile(r"^(ok|ERROR|FAIL|skipped (?P<reason>.*)|expected failure|"
                      r"unexpected success)$")
_THREAD = re.compile(r"^Exception in thread ")
_RAN = re.compile(r"^Ran (\d+) tests? in ")
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?P<msg> .*)?)?$")


@dataclass
class Unit:
    """One test, or one subtest of it, as the runner reported it."""
    outcome: str = ""           # ok, ERROR, FAIL, skipped, expected failure, ...
    reason: str = ""            # a skip's reason
    traceback: str = ""         # the ERROR/FAIL block's text
    thread_text: str = ""       # tracebacks of exceptions raised in the test's threads


@dataclass
class Test:
    """A test method: its outcome (the runner's line) and its subtests' blocks."""
    name: str
    where: str                  # pkg.mod.Class (the method name removed)
    units: dict[str, Unit] = field(default_factory=dict)   # "" = the test itself

    @property
    def id(self) -> str:
        return f"{self.where}.{self.name}"


@dataclass
class Parsed:
    tests: dict[tuple[str, str], Test]
    ran: int | None             # "Ran N tests", None when the run never finished


def _where(name: str, where: str) -> str:
    suffix = "." + name
    return where[: -len(suffix)] if where.endswith(suffix) else where


def _unit(tests, m) -> Unit:
    name, where = m["name"], _where(m["name"], m["where"])
    test = tests.setdefault((where, name), Test(name, where))
    return test.units.setdefault(m["sub"] or "", Unit())


def _set_outcome(unit: Unit, text: str) -> bool:
    m = _OUTCOME.match(text.strip())
    if not m:
        return False
    word = text.strip()
    if m["reason"] is not None:
        unit.outcome, unit.reason = "skipped", m["reason"].strip().strip("'\"")
    else:
        unit.outcome = word
    return True


def parse(text: str) -> Parsed:
    """The tests of one verbose unittest run, by (module.Class, method)."""
    tests: dict[tuple[str, str], Test] = {}
    lines = text.splitlines()
    ran = None
    pending: Unit | None = None     # a test whose outcome word has not been seen yet
    i = 0
    while i < len(lines):
        line = lines[i]
        block = _BLOCK.match(line)
        if block:
            unit = _unit(tests, block)
            i += 1
            while i < len(lines) and not _RULE.match(lines[i]):
                i += 1              # a docstring line, before the dashes
            i += 1
            body = []
            while i < len(lines) and not _RULE.match(lines[i]):
                body.append(lines[i])
                i += 1
            unit.traceback = "\n".join(body).strip("\n")
            if not unit.outcome or unit.outcome == "ok":
                unit.outcome = {"FAIL": "FAIL", "ERROR": "ERROR"}.get(
                    block["kind"], "unexpected success")
            pending = None
            continue
        ran_m = _RAN.match(line)
        if ran_m:
            ran = int(ran_m.group(1))
        start = _START.match(line)
        if start and not _RULE.match(line):
            pending = _unit(tests, start)
            rest = start["rest"] or ""
            if (start["dots"] is None and i + 1 < len(lines) and " ... " in lines[i + 1]
                    and not _START.match(lines[i + 1])):
                i += 1              # the test's docstring line carries " ... "
                rest = lines[i].split(" ... ", 1)[1]
            if _set_outcome(pending, rest):
                pending = None
            elif _THREAD.match(rest):
                pending.thread_text = rest + "\n"
        elif pending is not None and _set_outcome(pending, line):
            pending = None
        elif pending is not None and (pending.thread_text or _THREAD.match(line)):
            pending.thread_text += line + "\n"
        i += 1
    return Parsed(tests, ran)


def final_exception(traceback: str) -> str:
    """The last exception of a traceback: its ``Type: message`` line and the lines
    after it (an assertion's diff), or the whole text when there is none."""
    lines = traceback.splitlines()
    last_frame = max((k for k, ln in enumerate(lines) if ln.startswith("  File ")), default=-1)
    for k in range(last_frame + 1, len(lines)):
        if lines[k] and not lines[k][0].isspace() and _EXC_LINE.match(lines[k]):
            return "\n".join(lines[k:]).strip()
    return traceback.strip()


# How a run says that a file it was given does not exist: tflite_runtime's
# "Could not open 'PATH'.", Python's FileNotFoundError, pycoral's imprinting
# engine's "Failed to open file: PATH", and coralrt's refusal of a compiled model
# whose plain model is absent (coralrt/_model/compiled.py: "looked for X.tflite
# beside this file (PATH) and in ...: none exists").
_MISSING_PATTERNS = (
    re.compile(r"Could not open '(?P<path>[^']+)'"),
    re.compile(r"No such file or directory: '(?P<path>[^']+)'"),
    re.compile(r"Failed to open file: (?P<path>\S+)"),
    re.compile(r"looked for \S+ beside this file \((?P<path>.+?)\) and in .*none exists",
               re.S),
)


def missing_files(exception: str, data_dir: Path) -> list[Path]:
    """The absent files, under ``data_dir``, that ``exception`` (the final exception
    of a traceback) says could not be opened; none when it says anything else.
    A relative path is taken from ``data_dir``, the runs' working folder.  (Two
    threads' exceptions printed at once can share a line: every path counts.)"""
    first = exception.splitlines()[0] if exception else ""
    if first.startswith("AssertionError") and ' does not match "' in first:
        exception = first.split(' does not match "', 1)[1]   # assertRaisesRegex: what was raised
    elif first.startswith(("AssertionError", "unittest.")):
        return []                   # the test's own check failed, whatever it quotes
    root, found = Path(data_dir).absolute(), []
    for pattern in _MISSING_PATTERNS:
        for m in pattern.finditer(exception):
            if "{" in m["path"]:
                continue            # source code echoed in a traceback, not a path
            path = Path(m["path"].rstrip(".,;"))
            path = path if path.is_absolute() else root / path
            if path.is_relative_to(root) and not path.exists() and path not in found:
                found.append(path)
    return found


def missing_file(exception: str, data_dir: Path) -> Path | None:
    """The first of :func:`missing_files`, or ``None``."""
    return next(iter(missing_files(exception, data_dir)), None)


# An exception's last line, as threading's excepthook prints it.
_THREAD_EXC = re.compile(r"^(?!Exception in thread |Traceback )[A-Za-z_][\w.]*"
                         r"(?:Error|Exception|Exit|Failure)(?::.*)?$", re.M)


def _value_check(exc: str) -> bool:
    """Whether ``exc`` is a failed check of a result (a label, a score, a box),
    which a stand-in model may fail, rather than of an error's type or text."""
    first = exc.splitlines()[0] if exc else ""
    return (first.startswith("AssertionError")
            and " does not match " not in first and " not raised" not in first)


@dataclass
class Verdict:
    """A test's place in the table, and what to show for it."""
    test: Test
    status: str
    details: list[tuple[str, str]]   # (subtest, message) per error/failure or skip
    missing: list[Path]


def classify(test: Test, data_dir: Path, *, stand_in_module: bool = False) -> Verdict:
    """One status per test method: ``failed`` when any of its (sub)tests failed
    for a reason other than an absent file (``stand-in differs`` instead when the
    module runs a stand-in model and the reason is an assertion), ``missing data``
    when every error names an absent file, else ``skipped`` or ``passed``."""
    found, missing, details = set(), [], []

    def judge(sub: str, exc: str, shown: str, from_runner: bool = True) -> None:
        absent = missing_files(exc, data_dir) if from_runner else []
        if absent:
            missing.extend(absent)
            found.add(MISSING)
        else:
            found.add(DIFFERS if stand_in_module and _value_check(exc) else FAILED)
        details.append((sub, shown))

    for sub, unit in test.units.items():
        if sub == "" and not unit.outcome and len(test.units) > 1:
            continue                # its subtests' lines carry the outcomes
        if unit.outcome in ("ERROR", "FAIL", "unexpected success", ""):
            exc = final_exception(unit.traceback) if unit.traceback else (
                "unexpected success" if unit.outcome == "unexpected success"
                else "no outcome in the runner's output (the run ended early)")
            judge(sub, exc, exc, bool(unit.traceback))
        elif unit.thread_text:          # unittest does not see a thread's exception
            for exc in _THREAD_EXC.findall(unit.thread_text) or ["an exception in a thread"]:
                judge(sub, exc, f"in a thread (unittest counted the test as "
                                f"{unit.outcome or 'run'}): {exc}")
        elif unit.outcome == "skipped":
            found.add(SKIPPED)
            details.append((sub, f"skipped: {unit.reason}"))
    status = next((s for s in (FAILED, DIFFERS, MISSING, SKIPPED) if s in found), PASSED)
    return Verdict(test, status, details, missing)
