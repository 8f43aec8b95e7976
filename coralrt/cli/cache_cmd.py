"""``coralrt cache [info|clear]``: look at or empty the on-disk compile cache.

``coralrt cache`` alone is ``coralrt cache info``.

The cache is the one :class:`~coralrt.compile.cache.CompileCache` uses by
default, so ``CORALRT_CACHE_DIR``, ``CORALRT_CACHE`` and
``CORALRT_CACHE_MAX_BYTES`` apply here too.
"""

from __future__ import annotations

import argparse

from coralrt.cli._text import dumps, size_str, table
from coralrt.compile.cache import CompileCache

__all__ = ["add_parser", "command_info", "command_clear", "format_info"]


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "cache", parents=parents, help="show or clear the compile cache",
        description="Show or clear the on-disk cache of compiled Edge TPU segments. "
                    "CORALRT_CACHE_DIR sets its folder, CORALRT_CACHE=0 turns it off, "
                    "CORALRT_CACHE_MAX_BYTES caps its size. Without an action: info.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=command_info)
    actions = p.add_subparsers(dest="cache_command", metavar="ACTION",
                               title="actions (default: info)")
    info = actions.add_parser(
        "info", parents=parents, help="where the cache is, how many entries, how big",
        description="Print the cache folder, whether the cache is enabled, the number of "
                    "entries, their total size and the size cap.")
    info.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                      help="print one JSON object")
    info.set_defaults(func=command_info)
    clear = actions.add_parser(
        "clear", parents=parents, help="remove every cache entry",
        description="Remove every entry of the compile cache; models are compiled again "
                    "the next time they are loaded.")
    clear.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object")
    clear.set_defaults(func=command_clear)


def format_info(info: dict) -> str:
    """The human-readable form of :meth:`CompileCache.info`."""
    rows = [
        ["directory", info["directory"]],
        ["enabled", "yes" if info["enabled"] else "no (CORALRT_CACHE)"],
        ["entries", f"{info['entries']:,}"],
        ["size", size_str(info["total_bytes"])],
        ["size cap", size_str(info["max_bytes"])],
        ["format version", str(info["format_version"])],
    ]
    return table(None, rows, indent="")


def command_info(args) -> int:
    info = CompileCache().info()
    print(dumps(info) if args.json else format_info(info))
    return 0


def command_clear(args) -> int:
    cache = CompileCache()
    n = cache.clear()
    if args.json:
        print(dumps({"removed": n, "directory": str(cache.root)}))
        return 0
    print(f"removed {n:,} cache {'entry' if n == 1 else 'entries'} from {cache.root}")
    return 0
