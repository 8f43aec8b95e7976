"""Every code block in README.md and docs/*.md runs, or says why it cannot.

Conventions for the fenced code blocks of README.md and docs/*.md:

- Every fenced block names its language.
- ```python blocks are executed, each in a fresh namespace, with the current
  directory a temporary folder that holds the third-party test models of
  ``../shared/models`` by their file names (``mobilenet_v1_0.25_128_quant.tflite``,
  ``edgetpu/...``, ``invalid/...``; symlinks) and the images and label files of
  ``../shared/images`` (``cat.bmp``, ``imagenet_labels.txt``...).  A block that names a
  ``.tflite`` file skips, with the reason, when that folder is absent.  HOME
  and the XDG folders point into a private folder, so the compile cache and
  the firmware folder are the block's own, whatever this machine has.
  ``CORALRT_TARGET=sim`` is set: a program that loads libedgetpu's delegate
  runs on the simulated stick, as no stick is attached where the docs are tested.
- ```console blocks are terminal transcripts: a line starting with ``$ `` is
  a command (a trailing backslash continues it), the lines up to the next
  command are its output (stdout and stderr).  ``coralrt ...`` runs in-process
  through ``coralrt._cli.main.main(argv)``, ``python ...`` as a subprocess,
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

import pytest
from conftest import MISSING_REASON, MODELS_DIR, REPO_ROOT

from tests.support.doc_blocks import (
    ALL_BLOCKS, DOC_FILES, DOCS, FENCE, MARKER, MODEL_NAME, NOT_CODE, RUN, Block,
    implied_status, line_pattern, normalize, parse_shown_json, parse_transcript, run_command,
    run_console, run_python, run_shell, same_keys,
)



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
                if not MARKER.match(line) or not rest or not FENCE.match(rest[0]):
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
    images = MODELS_DIR.parent / "images"     # test images and label files, by name too
    if images.is_dir():
        for entry in images.iterdir():
            if not (work / entry.name).exists():
                (work / entry.name).symlink_to(entry)
    home = tmp_path / "home"
    for var, sub in (("HOME", ""), ("XDG_CACHE_HOME", ".cache"),
                     ("XDG_DATA_HOME", ".local/share"), ("XDG_CONFIG_HOME", ".config")):
        (home / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(home / sub))
    for var in ("CORALRT_CACHE_DIR", "CORALRT_CACHE", "CORALRT_CACHE_MAX_BYTES"):
        monkeypatch.delenv(var, raising=False)
    # No stick where the docs are tested: programs that load libedgetpu's delegate run
    # on the simulated one, as `python -m coralrt.compat --target sim` runs them.
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    monkeypatch.chdir(work)
    return work


def _needs_models(block: Block) -> None:
    if not MODELS_DIR.is_dir() and MODEL_NAME.search(block.code):
        pytest.skip(MISSING_REASON)



def _params() -> list:
    return [pytest.param(b, id=f"{b.where}-{b.lang}") for b in ALL_BLOCKS if b.runs]


@pytest.mark.needs_litert
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
    assert line_pattern("fix: ...").match(normalize("fix: install the rule: x"))
    assert not line_pattern("fix: install").match(normalize("fix: remove"))


def test_transcript_parsing_and_status():
    steps = parse_transcript("$ coralrt a \\\n  --json\n{\n}\n$ echo $?\n1\n")
    assert steps == [("coralrt a --json", ["{", "}"]), ("echo $?", ["1"])]
    assert implied_status(["{"], steps[1]) == 1
    assert implied_status(["coralrt: error: x"], None) is None
    assert implied_status(["model  x"], None) == 0


def test_json_keys_compared_recursively():
    shown = parse_shown_json(['{"a": 1,', '"b": [{"c": 2},', "...", "]}"])
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
    from coralrt.plugins import _hookspecs as hookspecs
    text = (DOCS / "plugins.md").read_text()
    for name in dir(hookspecs):
        if name.startswith("coralrt_"):
            assert f"## `{name}(" in text, f"docs/plugins.md has no section for {name}"


def test_operator_tables_match_the_operator_specs():
    """The docs' operator tables are generated from coralrt/_ops; a spec change that
    is not written back (``python -m coralrt._ops.doc_tables``) fails here."""
    from coralrt._ops.doc_tables import TABLES, render, tables_in
    seen = set()
    for path in DOC_FILES:
        for name, body in tables_in(path.read_text(encoding="utf-8")).items():
            assert name in TABLES, f"{path.name}: unknown operator table {name!r}"
            assert body == render(name), (f"{path.name}: the {name} table differs from the "
                                          f"operator specs; run python -m coralrt._ops.doc_tables")
            seen.add(name)
    assert seen == set(TABLES), f"tables no page shows: {sorted(set(TABLES) - seen)}"
