"""``coralrt serve-compiler``: run the compile service (docs/compile-service.md).

Needs edgetpu_compiler on this machine and the ``server`` extra
(``pip install 'coralrt[server]'``, which installs aiohttp).
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
from pathlib import Path

from coralrt import _config as config
from coralrt._cli.run_cmd import count_type
from coralrt._compile.remote import is_loopback
from coralrt.errors import COMPILER_HELP, CompilerUnavailableError, ConfigError, CoralRTError

__all__ = ["add_parser", "command", "read_token"]

log = logging.getLogger("coralrt.cli")

# The apt steps of the general advice, without its other ways to compile (one of them
# is running this very service).
INSTALL_STEPS = "\n".join(line for line in COMPILER_HELP.splitlines()[1:]
                          if line.startswith("  ") and not line.startswith("  - "))


class ServiceCompilerMissing(CompilerUnavailableError):
    """edgetpu_compiler is missing where ``coralrt serve-compiler`` was started: the
    message is only this command's remedy."""

    def __init__(self, message: str):
        CoralRTError.__init__(self, message)

DEFAULT_PORT = 8765


def _size(text: str) -> int:
    size = config.parse_size(text)
    if size is None or size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (for example 64M)")
    return size


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "serve-compiler", parents=parents,
        help="run a compile service for machines without edgetpu_compiler",
        description="Serve edgetpu_compiler over HTTP(S) to machines that do not have it "
                    "(a Raspberry Pi, a fleet of them): they set CORALRT_COMPILER_URL and "
                    "post their Edge TPU segments here; each segment is compiled once and "
                    "kept in this service's cache. Needs edgetpu_compiler (x86-64 Linux) "
                    "and pip install 'coralrt[server]'. See docs/compile-service.md.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; "
                        "0.0.0.0 for every interface, which needs --token-file)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--token-file", metavar="FILE",
                   help="file holding the token clients must send (Authorization: Bearer); "
                        "make it readable by the service's user only")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--compiler", metavar="PATH",
                   help="the edgetpu_compiler to run (default: CORALRT_EDGETPU_COMPILER, "
                        "then PATH)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="the service's compile cache (default: <coralrt cache>/service)")
    p.add_argument("--cache-max-bytes", type=_size, metavar="SIZE",
                   help="size cap of that cache (default: CORALRT_CACHE_MAX_BYTES or 1G)")
    p.add_argument("--max-upload", type=_size, default=64 << 20, metavar="SIZE",
                   help="largest segment accepted (default 64M)")
    p.add_argument("--max-upload-total", type=_size, default=256 << 20, metavar="SIZE",
                   help="memory for the uploads in flight (read, waiting or compiling) in "
                        "all; more are answered 503 busy (default 256M, at least "
                        "--max-upload)")
    p.add_argument("--body-timeout", type=_seconds, default=60.0, metavar="SEC",
                   help="seconds one upload's body may take to arrive; slower ones are "
                        "answered 408 (default 60)")
    p.add_argument("--compile-timeout", type=_seconds, default=180.0, metavar="SEC",
                   help="seconds one compile may take before it is stopped (default 180)")
    p.add_argument("--max-concurrent", type=count_type(1), default=2, metavar="N",
                   help="compiles run at once (default 2)")
    p.add_argument("--max-queue", type=count_type(1), default=32, metavar="N",
                   help="requests that may wait for a compile slot; more are answered "
                        "503 busy (default 32)")
    p.add_argument("--allow-anonymous", action="store_true",
                   help="listen on a non-loopback address without a token (anyone who can "
                        "reach the port can use the compiler)")
    p.set_defaults(func=command)


def read_token(path: str) -> str:
    """The token in ``path`` (whitespace stripped); warns when others may read the file."""
    p = Path(path).expanduser()
    try:
        token = p.read_text("utf-8").strip()
        mode = p.stat().st_mode
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--token-file {path}: cannot read the token ({e})") from None
    if not token:
        raise ConfigError(f"--token-file {path} is empty")
    if len(token) < 16:
        raise ConfigError(f"--token-file {path}: the token has {len(token)} characters; use "
                          f"at least 16 (for example: python -c 'import secrets; "
                          f"print(secrets.token_urlsafe(32))' > {path})")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the token file %s can be read by other users (mode %o); chmod 600 it",
                    path, stat.S_IMODE(mode))
    return token


def command(args) -> int:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    token = read_token(args.token_file) if args.token_file else None
    if not is_loopback(args.host):
        if token is None and not args.allow_anonymous:
            raise ConfigError(
                f"--host {args.host} without --token-file would let anyone who can reach "
                f"port {args.port} use this machine's compiler; give --token-file (and "
                f"--tls-cert/--tls-key), or --allow-anonymous on a network you trust")
        if token is not None and not args.tls_cert:
            log.warning("serving on %s without TLS: clients' tokens cross the network in "
                        "clear; give --tls-cert/--tls-key or put a TLS reverse proxy in front "
                        "of a service bound to 127.0.0.1", args.host)
    try:
        from coralrt._server.app import serve, tls_context
        from coralrt._server.service import CompileService, Limits
    except ImportError as e:
        raise ConfigError(f"the compile service needs aiohttp, which the server extra "
                          f"installs: pip install 'coralrt[server]' ({e})") from None
    limits = Limits(max_upload_bytes=args.max_upload, max_concurrent=args.max_concurrent,
                    max_queue=args.max_queue, max_upload_total=args.max_upload_total,
                    body_timeout=args.body_timeout)
    from coralrt._compile.cache import CompileCache
    from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler

    try:
        compiler = EdgeTpuCompiler(args.compiler, timeout=args.compile_timeout)
        version = compiler.version  # CompileError (a broken compiler): said, exit 1
    except CompilerUnavailableError as e:
        # The general advice offers a compile service: this command is one, so say
        # only what it needs.
        where = (f"--compiler {args.compiler}" if args.compiler else
                 "edgetpu_compiler was not found on PATH and CORALRT_EDGETPU_COMPILER is not "
                 "set")
        raise ServiceCompilerMissing(
            f"the compile service runs edgetpu_compiler, and here it is missing ({where}). "
            f"Install it on this x86-64 Linux machine, then start the service again, or give "
            f"the path of an edgetpu_compiler executable with --compiler PATH (or "
            f"CORALRT_EDGETPU_COMPILER). To install it:\n{INSTALL_STEPS}") from e
    log.info("edgetpu_compiler %s at %s", version, compiler.path)
    cache = CompileCache(Path(args.cache_dir) if args.cache_dir
                         else config.cache_dir() / "service",
                         max_bytes=args.cache_max_bytes, enabled=True)
    context = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    service = CompileService(compiler, cache, limits)
    os.umask(0o077)   # the cache holds what clients sent: for the service's user only
    serve(service, host=args.host, port=args.port, token=token, ssl_context=context)
    return 0
