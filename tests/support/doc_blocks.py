"""Reading the code blocks of the docs and running them as ``tests/test_docs.py`` does.

The rules they follow are in that module's docstring.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO_ROOT


DOCS = REPO_ROOT / "docs"
DOC_FILES = [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

RUN = {"python", "console", "sh", "bash", "toml"}
NOT_CODE = {"text"}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")
MODEL_NAME = re.compile(r"[\w./-]+\.tflite\b")


@dataclass
class Block:
    path: Path
    line: int          # 1-based line of the opening fence
    lang: str
    code: str
    skip_reason: str | None   # None: no marker; "" : a marker without a reason

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.skip_reason is None and self.lang in RUN


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks = m["indent"], m["ticks"]
        lang = m["info"].strip().split()[0].lower() if m["info"].strip() else ""
        j = i + 1
        while j < len(lines) and not re.match(
                rf"^[ \t]*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.relative_to(REPO_ROOT)}:{i + 1}: unclosed code block")
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = MARKER.match(lines[k]) if k >= 0 else None
        blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n",
                            marker["reason"].strip() if marker else None))
        i = j + 1
    return blocks


ALL_BLOCKS = [b for p in DOC_FILES for b in read_blocks(p)]


# -- running commands ----------------------------------------------------------------

_OPERATORS = set("|&;<>()")


def run_command(command: str, work: Path, capsys, monkeypatch) -> tuple[int, str, str, dict]:
    """Run one shell-like command line; returns (status, stdout, stderr, path map)."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    argv = list(lex)
    if any(set(tok) <= _OPERATORS for tok in argv):
        raise AssertionError(f"cannot run {command!r}: pipes, redirections and command "
                             "lists are not run; mark the block `<!-- not run: REASON -->`")
    env, mapped = {}, {}
    while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        if value.startswith("/"):
            moved = work / "root" / value.lstrip("/")
            mapped[str(moved)] = value
            value = str(moved)
        env[name] = value
    if not argv:
        raise AssertionError(f"nothing to run in {command!r}")
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        if argv[0] == "coralrt":
            from coralrt._cli.main import main
            capsys.readouterr()
            status = main(argv[1:])
            out, err = capsys.readouterr()
        elif argv[0] in ("python", "python3"):
            proc = subprocess.run([sys.executable, *argv[1:]], cwd=work, capture_output=True,
                                  text=True, timeout=300, env=os.environ.copy())
            status, out, err = proc.returncode, proc.stdout, proc.stderr
        else:
            raise AssertionError(f"cannot run {command!r} here (only coralrt, python and "
                                 "`echo $?`); mark the block `<!-- not run: REASON -->`")
    return status, out, err, mapped


def parse_transcript(code: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1].rstrip() + " " + lines[i].strip()
            steps.append((command.strip(), []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"a console block starts with a `$ ` command, not {line!r}")
        i += 1
    return steps


_PATH = re.compile(r"(?<![\w.:/~-])/[^\s,;()\[\]'\"`]*")
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")


def normalize(line: str) -> str:
    line = _PATH.sub(lambda m: "<path>/" + m.group(0).rstrip("/").rsplit("/", 1)[-1],
                     line)
    line = _NUMBER.sub("#", line)
    return " ".join(line.split())


def line_pattern(shown: str) -> re.Pattern:
    parts = normalize(shown).split("...")
    return re.compile(".*".join(re.escape(p) for p in parts) + r"\Z")


def implied_status(shown: list[str], next_step) -> int | None:
    if next_step is not None and next_step[0] == "echo $?":
        text = [x.strip() for x in next_step[1] if x.strip()]
        return int(text[0]) if text else None
    first = next((x.strip() for x in shown if x.strip()), "")
    if first.startswith(("coralrt: error:", "usage:", "Traceback")):
        return None     # some non-zero status
    return 0


def parse_shown_json(shown: list[str]):
    text = "\n".join(x for x in shown if x.strip() != "...")
    text = re.sub(r",(\s*[\]}])", r"\1", text)
    return json.loads(text)


def same_keys(shown, real, where: str = "$") -> None:
    if isinstance(shown, dict):
        assert isinstance(real, dict), f"{where}: shown an object, the command printed {real!r}"
        assert set(shown) == set(real), (
            f"{where}: keys differ; only shown: {sorted(set(shown) - set(real))}, "
            f"only printed: {sorted(set(real) - set(shown))}")
        for key in shown:
            same_keys(shown[key], real[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(real, list), f"{where}: shown a list, the command printed {real!r}"
        if any(isinstance(x, (dict, list)) for x in shown):
            assert real, f"{where}: shown items, the command printed an empty list"
        for i, (s, r) in enumerate(zip(shown, real)):
            same_keys(s, r, f"{where}[{i}]")


def check_output(command: str, shown: list[str], out: str, err: str, mapped: dict) -> None:
    for moved, original in mapped.items():
        out, err = out.replace(moved, original), err.replace(moved, original)
    shown_text = [x for x in shown if x.strip()]
    if not shown_text:
        return
    if shown_text[0].lstrip().startswith(("{", "[")):
        try:
            real = json.loads(out)
        except ValueError as e:
            raise AssertionError(f"`{command}` shows JSON but printed:\n{out}{err}") from e
        same_keys(parse_shown_json(shown), real)
        return
    real_lines = [normalize(x) for x in (out + "\n" + err).splitlines()]
    missing = []
    for line in shown_text:
        if line.strip() == "...":
            continue
        pattern = line_pattern(line)
        if not any(pattern.match(r) for r in real_lines):
            missing.append(line)
    assert not missing, (f"`{command}`: these shown lines are not in its output:\n  "
                         + "\n  ".join(missing) + f"\n--- it printed:\n{out}{err}")


def run_console(block: Block, work: Path, capsys, monkeypatch) -> None:
    steps = parse_transcript(block.code)
    assert steps, f"{block.where}: an empty console block"
    last = None
    for n, (command, shown) in enumerate(steps):
        if command == "echo $?":
            continue    # checked with the command before it
        nxt = steps[n + 1] if n + 1 < len(steps) else None
        status, out, err, mapped = run_command(command, work, capsys, monkeypatch)
        expected = implied_status(shown, nxt)
        if expected is None:
            assert status != 0, f"`{command}` should fail as shown, exited 0:\n{out}{err}"
        else:
            assert status == expected, (f"`{command}` exited {status}, the transcript "
                                        f"implies {expected}:\n{out}{err}")
        check_output(command, shown, out, err, mapped)
        last = status
    assert last is not None, f"{block.where}: no command in the block"


def run_shell(block: Block, work: Path, capsys, monkeypatch) -> None:
    commands = [x.strip() for x in block.code.splitlines()
                if x.strip() and not x.strip().startswith("#")]
    assert commands, f"{block.where}: an empty {block.lang} block"
    for command in commands:
        status, out, err, _ = run_command(command, work, capsys, monkeypatch)
        assert status == 0, f"`{command}` exited {status}:\n{out}{err}"


def run_python(block: Block, capsys) -> None:
    # Padded so that a traceback names the doc file and its line numbers.
    code = compile("\n" * block.line + block.code, str(block.path), "exec")
    exec(code, {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    if block.path.name == "plugins.md":
        assert out, f"{block.where}: the plugin guide's examples print what they show"
