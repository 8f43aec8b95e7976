"""Every code block in README.md and docs/*.md runs, or says why it cannot.

Conventions for the fenced code blocks of README.md and docs/*.md:

- Every fenced block names its language.
- ```python blocks are executed, each in a fresh namespace, with the current
  directory a temporary folder that holds the third-party test models of
  ``../shared/models`` by their file names (``mobilenet_v1_0.25_128_quant.tflite``,
  ``edgetpu/...``, ``invalid/...``; symlinks).  A block that names a
  ``.tflite`` file skips, with the reason, when that folder is absent.  HOME
  and the XDG folders point into a private folder, so the compile cache and
  the firmware folder are the block's own, whatever this machine has.
- ```console blocks are terminal transcripts: a line starting with ``$ `` is
  a command (a trailing backslash continues it), the lines up to the next
  command are its output (stdout and stderr).  ``coralrt ...`` runs in-process
  through ``coralrt.cli.main.main(argv)``, ``python ...`` as a subprocess,
  ``echo $?`` prints the previous exit status; ``VAR=value`` before a command
  sets an environment variable for it (an absolute path is moved into the
  temporary folder, and mapped back in the output).  Nothing else runs: a block
  with other commands (sudo, pip, apt, make, pipes, redirections) needs the
  marker below.  Checks:
    - the exit status: the number a following ``$ echo $?`` shows, else
      non-zero exactly when the shown output starts with ``coralrt: error:``,
      ``usage:`` or ``Traceback``;
    - output that starts with ``{`` or ``[`` is JSON: the shown object (``...``
      lines and trailing commas allowed) must have the same keys as the real
      stdout, recursively (list items compared by position, as far as shown);
    - any other output: every shown line must match a line of the real
      output, with numbers (integers, decimals, ``1,234``, ``1e-05``) matching
      any number, runs of spaces compared as one, an absolute path matching
      any absolute path to a file of the same name, and ``...`` matching any
      text (a line that is only ``...`` matches nothing and is skipped).
- ```sh and ```bash blocks are commands, one per line (``#`` comments
  allowed); they run like console commands and must exit 0.
- ```toml blocks must parse (``tomllib``).
- ```text blocks (diagrams, file formats, register tables, messages) are not
  code and are not run.
- Any block preceded by the line ``<!-- not run: REASON -->`` is illustrative:
  it is not run, and REASON must say why (needs a Coral stick, network, sudo...).

``test_every_block_is_covered`` enforces these rules on every file, so a new
doc page or block follows them too.  The outputs are compared with whatever
the code prints when the test runs: nothing here is a copy of an output.
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

import pytest
from conftest import MISSING_REASON, MODELS_DIR, REPO_ROOT

DOCS = REPO_ROOT / "docs"
DOC_FILES = [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

RUN = {"python", "console", "sh", "bash", "toml"}
NOT_CODE = {"text"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")
_MODEL_NAME = re.compile(r"[\w./-]+\.tflite\b")


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
        m = _FENCE.match(lines[i])
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
        marker = _MARKER.match(lines[k]) if k >= 0 else None
        blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n",
                            marker["reason"].strip() if marker else None))
        i = j + 1
    return blocks


ALL_BLOCKS = [b for p in DOC_FILES for b in read_blocks(p)]


def test_every_block_is_covered():
    problems = []
    for b in ALL_BLOCKS:
        if not b.lang:
            problems.append(f"{b.where}: code block without a language (```python, "
                            "```console, ```sh, ```text ...)")
        elif b.skip_reason == "":
            problems.append(f"{b.where}: `<!-- not run: -->` needs a reason")
        elif b.skip_reason is None and b.lang not in RUN | NOT_CODE:
            problems.append(f"{b.where}: ```{b.lang} blocks are not run: mark the block "
                            "`<!-- not run: REASON -->` or use one of "
                            f"{sorted(RUN | NOT_CODE)}")
    assert not problems, "\n".join(problems)


def test_every_marker_belongs_to_a_block():
    problems = []
    for path in DOC_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if line.lstrip().startswith("<!--") and "not run" in line:
                rest = [x for x in lines[n + 1:] if x.strip()]
                if not _MARKER.match(line) or not rest or not _FENCE.match(rest[0]):
                    problems.append(f"{path.relative_to(REPO_ROOT)}:{n + 1}: a `not run` "
                                    "marker must be a line of its own right before a code block")
    assert not problems, "\n".join(problems)


# -- the folder the blocks run in ---------------------------------------------------

@pytest.fixture
def doc_dir(tmp_path, monkeypatch):
    """A temporary working folder with the shared models, and a private home.

    HOME and the XDG folders point into it, so the compile cache and the
    firmware folder are the block's own, whatever this machine has installed.
    """
    work = tmp_path / "work"
    work.mkdir()
    if MODELS_DIR.is_dir():
        for entry in MODELS_DIR.iterdir():
            (work / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    home = tmp_path / "home"
    for var, sub in (("HOME", ""), ("XDG_CACHE_HOME", ".cache"),
                     ("XDG_DATA_HOME", ".local/share"), ("XDG_CONFIG_HOME", ".config")):
        (home / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(home / sub))
    for var in ("CORALRT_CACHE_DIR", "CORALRT_CACHE", "CORALRT_CACHE_MAX_BYTES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(work)
    return work


def _needs_models(block: Block) -> None:
    if not MODELS_DIR.is_dir() and _MODEL_NAME.search(block.code):
        pytest.skip(MISSING_REASON)


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
            from coralrt.cli.main import main
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


def _line_pattern(shown: str) -> re.Pattern:
    parts = normalize(shown).split("...")
    return re.compile(".*".join(re.escape(p) for p in parts) + r"\Z")


def _implied_status(shown: list[str], next_step) -> int | None:
    if next_step is not None and next_step[0] == "echo $?":
        text = [x.strip() for x in next_step[1] if x.strip()]
        return int(text[0]) if text else None
    first = next((x.strip() for x in shown if x.strip()), "")
    if first.startswith(("coralrt: error:", "usage:", "Traceback")):
        return None     # some non-zero status
    return 0


def _parse_shown_json(shown: list[str]):
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
        same_keys(_parse_shown_json(shown), real)
        return
    real_lines = [normalize(x) for x in (out + "\n" + err).splitlines()]
    missing = []
    for line in shown_text:
        if line.strip() == "...":
            continue
        pattern = _line_pattern(line)
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
        expected = _implied_status(shown, nxt)
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


def _params() -> list:
    return [pytest.param(b, id=f"{b.where}-{b.lang}") for b in ALL_BLOCKS if b.runs]


@pytest.mark.parametrize("block", _params())
def test_doc_block_runs(block: Block, doc_dir, capsys, monkeypatch):
    _needs_models(block)
    if block.lang == "python":
        run_python(block, capsys)
    elif block.lang == "console":
        run_console(block, doc_dir, capsys, monkeypatch)
    elif block.lang in ("sh", "bash"):
        run_shell(block, doc_dir, capsys, monkeypatch)
    elif block.lang == "toml":
        try:
            import tomllib
        except ImportError:     # Python 3.10
            tomllib = pytest.importorskip("tomli")
        tomllib.loads(block.code)
    else:  # pragma: no cover - RUN and this function list the same languages
        raise AssertionError(block.lang)


# -- the checker itself ----------------------------------------------------------------

def test_normalize_treats_numbers_paths_and_spaces_as_equal():
    assert normalize("size   525,598 bytes (513.3 KiB)") == normalize("size 1 bytes (2 KiB)")
    assert normalize("zero point  -128") == normalize("zero point 5")
    assert normalize("lib: /tmp/a/b/libusb-1.0.so") == normalize("lib: /work/x/libusb-1.0.so")
    assert normalize("lib: /tmp/a/b/libusb-1.0.so") != normalize("lib: /work/x/other.so")
    assert normalize("1x128x128x3 uint8") != normalize("1x128x128 uint8")
    assert _line_pattern("fix: ...").match(normalize("fix: install the rule: x"))
    assert not _line_pattern("fix: install").match(normalize("fix: remove"))


def test_transcript_parsing_and_status():
    steps = parse_transcript("$ coralrt a \\\n  --json\n{\n}\n$ echo $?\n1\n")
    assert steps == [("coralrt a --json", ["{", "}"]), ("echo $?", ["1"])]
    assert _implied_status(["{"], steps[1]) == 1
    assert _implied_status(["coralrt: error: x"], None) is None
    assert _implied_status(["model  x"], None) == 0


def test_json_keys_compared_recursively():
    shown = _parse_shown_json(['{"a": 1,', '"b": [{"c": 2},', "...", "]}"])
    same_keys(shown, {"a": 9, "b": [{"c": 0}, {"c": 1, "d": 2}]})
    with pytest.raises(AssertionError, match="only printed"):
        same_keys(shown, {"a": 9, "b": [{"c": 0, "d": 1}]})
    with pytest.raises(AssertionError, match="only shown"):
        same_keys(shown, {"b": []})


def test_commands_that_cannot_run_are_refused(tmp_path, capsys, monkeypatch):
    for command in ("sudo make install", "coralrt demo | head", "pip install coralrt"):
        with pytest.raises(AssertionError, match="not run"):
            run_command(command, tmp_path, capsys, monkeypatch)


# -- the plugin guide ------------------------------------------------------------------

def test_plugin_guide_covers_every_hook():
    from coralrt.plugins import hookspecs
    text = (DOCS / "plugins.md").read_text()
    for name in dir(hookspecs):
        if name.startswith("coralrt_"):
            assert f"## `{name}(" in text, f"docs/plugins.md has no section for {name}"
