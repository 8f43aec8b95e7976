"""``coralrt`` entry point: argument parsing, logging, and the error contract.

Exit codes: 0 success, 1 an error coralrt reports (a
:class:`~coralrt.errors.CoralRTError` or a file error), 2 a usage error
(argparse's convention), 130 interrupted.  Errors print one line,
``coralrt: error: <message>``, on stderr; ``--debug`` adds the traceback and
DEBUG logging.  Results go to stdout, logging to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
import traceback

from coralrt._cli import (
    bench_cmd, cache_cmd, compile_cmd, demo_cmd, inspect_cmd, partition_cmd, run_cmd,
)
from coralrt._cli import devices_cmd, doctor_cmd, firmware_cmd
from coralrt._cli import plugins_cmd, selftest_cmd, serve_cmd
from coralrt.errors import CoralRTError, ModelError
from coralrt._logs import StderrHandler

__all__ = ["main", "build_parser"]

PROG = "coralrt"
_COMMANDS = (inspect_cmd, partition_cmd, compile_cmd, run_cmd, bench_cmd, demo_cmd,
             cache_cmd, firmware_cmd, devices_cmd, doctor_cmd, selftest_cmd, plugins_cmd,
             serve_cmd)


def _version() -> str:
    import coralrt
    return coralrt.__version__


def _common_options(suppress: bool) -> argparse.ArgumentParser:
    # The same flags are accepted before and after the command name.  On the
    # command's parser the defaults are suppressed, so that a flag given
    # before the command is not reset by the command's default.
    default = argparse.SUPPRESS if suppress else False
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=default,
                        help="log at DEBUG level and show tracebacks of errors")
    common.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="log at INFO level")
    common.add_argument("-q", "--quiet", action="store_true", default=default,
                        help="draw no progress bars (they are drawn on stderr, only when it "
                             "is a terminal and tqdm is installed)")
    return common


class _Formatter(argparse.HelpFormatter):
    """argparse's layout, but a line never breaks inside a word or at a hyphen,
    so URLs and file names in help texts stay whole (and clickable)."""

    def _split_lines(self, text, width):
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent,
                             break_long_words=False, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """Every parser of the command line, the commands' and their actions' too
    (``add_subparsers`` makes parsers of its parser's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, parents=[_common_options(suppress=False)],
        description="Inspect and run TFLite models with coralrt, the pure-Python runtime "
                    "for the Google Coral Edge TPU.",
        epilog=f"Run '{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    parents = [_common_options(suppress=True)]
    for module in _COMMANDS:
        module.add_parser(sub, parents)
    return parser


def _setup_logging(args) -> tuple[logging.Logger, logging.Handler, int]:
    logger = logging.getLogger("coralrt")
    handler = StderrHandler()
    fmt = "%(name)s: %(levelname)s: %(message)s" if args.debug else "coralrt: %(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if args.debug else
                    logging.INFO if args.verbose else logging.WARNING)
    return logger, handler, previous


def _message(exc: BaseException) -> str:
    """The error's text as the user should read it: its own lines kept (install
    steps must stay paste-able), trailing blanks dropped, nothing wrapped, so a
    URL is never split."""
    if isinstance(exc, OSError) and not isinstance(exc, CoralRTError) and exc.strerror:
        # "[Errno 2] No such file or directory: 'x'" -> "x: No such file or directory"
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    lines = [line.rstrip() for line in text.strip().splitlines()]
    return "\n".join(line for line in lines if line) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit code (never raises SystemExit)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    logger, handler, previous = _setup_logging(args)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`coralrt inspect m | head`): not an error worth
        # a message, but stdout must not be flushed again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except (CoralRTError, OSError) as e:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        message = _message(e)
        model = getattr(args, "model", None)
        if isinstance(e, ModelError) and model is not None and str(model) not in message:
            # Some model errors only say where inside the file: name the file too.
            message = f"{model}: {message}"
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 1
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


if __name__ == "__main__":
    sys.exit(main())
