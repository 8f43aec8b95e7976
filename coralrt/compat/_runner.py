"""``python -m coralrt.compat``: run an unmodified tflite_runtime / pycoral program on coralrt.

Like ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``, ``python -c CODE ARGS``),
with the import hook of :mod:`coralrt.compat._finder` installed first: the
program's ``sys.argv``, ``__main__`` and ``sys.path[0]`` are what python would
give it, and its exit status is the command's. ``--target`` sets
``CORALRT_TARGET`` for it. ``CORALRT_COMPAT=1`` is set in the environment, so
Python processes the program starts (multiprocessing children, subprocesses)
get the hook too where coralrt's start-up hook is installed.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import textwrap
import types

from coralrt.compat._finder import ENV, install
from coralrt._config import COMPAT_TARGETS

__all__ = ["main", "TARGETS"]

#: What ``CORALRT_TARGET`` and ``--target`` accept: the session's targets (a live
#: view of the target registry, :mod:`coralrt._targets`).
TARGETS = COMPAT_TARGETS

_DESCRIPTION = """\
Run a Python program written for tflite_runtime and libedgetpu, or for pycoral,
unchanged on coralrt: its imports of tflite_runtime and pycoral get coralrt's
modules of the same API. Everything after SCRIPT (or -m MODULE, -c CODE) goes to
the program as its sys.argv[1:]."""

_EPILOG = ("The target is where Edge TPU work goes: the variable CORALRT_TARGET ({names}; "
           "default auto: a Coral stick when one is present, else the CPU). Programs "
           "coralrt does not start (multiprocessing children, a container's command) get "
           "the same mapping when CORALRT_COMPAT=1 is in their environment. "
           "Guide: docs/porting.md.")


def _parser() -> argparse.ArgumentParser:
    names = tuple(TARGETS)
    parser = argparse.ArgumentParser(
        prog="python -m coralrt.compat", description=_DESCRIPTION,
        epilog=textwrap.fill(_EPILOG.format(names=f"{', '.join(names[:-1])} or {names[-1]}"),
                             78),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"%(prog)s [-h] [--target {{{','.join(names)}}}] "
              "(SCRIPT | -m MODULE | -c CODE) [ARGS ...]")
    parser.add_argument("--target", choices=names,
                        help="set CORALRT_TARGET for the program (default: its current "
                             "value, else auto)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("-m", dest="module", metavar="MODULE",
                      help="run a module as a script, like python -m")
    what.add_argument("-c", dest="code", metavar="CODE",
                      help="run a program passed as a string, like python -c")
    parser.add_argument("script", nargs="?", metavar="SCRIPT",
                        help="path of the program to run")
    return parser


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The runner's own arguments, and the program's (from SCRIPT, or after the
    value of -m / -c, on)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i + 2], argv[i + 2:]
        if arg in ("-m", "-c", "--target"):
            if arg != "--target":
                return argv[:i + 2], argv[i + 2:]
            i += 2
            continue
        if arg.startswith(("-m", "-c")) and not arg.startswith("--"):   # -mpkg, -c'code'
            return argv[:i + 1], argv[i + 1:]
        if arg.startswith("-") and arg != "-":
            i += 1
            continue
        return argv[:i + 1], argv[i + 1:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, rest = _split(argv)
    parser = _parser()
    ns = parser.parse_args(own)
    if ns.script is None and ns.module is None and ns.code is None:
        parser.error("name the program to run: SCRIPT, -m MODULE or -c CODE")
    if ns.script is not None and (ns.module is not None or ns.code is not None):
        parser.error("give SCRIPT, -m MODULE or -c CODE, not several")
    if ns.target is not None:
        os.environ["CORALRT_TARGET"] = ns.target
    os.environ[ENV] = "1"
    install()

    if ns.code is not None:
        sys.argv = ["-c", *rest]
        sys.path[0] = ""
        main_module = types.ModuleType("__main__")
        main_module.__builtins__ = __builtins__
        sys.modules["__main__"] = main_module
        exec(compile(ns.code, "<string>", "exec"), main_module.__dict__)
        return 0
    if ns.module is not None:
        sys.argv = [ns.module, *rest]   # runpy puts the module's path in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(ns.module, run_name="__main__", alter_sys=True)
        return 0
    script = ns.script
    if not os.path.exists(script):
        print(f"{parser.prog}: error: can't open file {os.path.abspath(script)!r}: "
              f"no such file", file=sys.stderr)
        return 2
    sys.argv = [script, *rest]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0
