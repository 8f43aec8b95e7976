"""``coralrt cache [info|clear|export|import]``: the on-disk compile cache.

``coralrt cache`` alone is ``coralrt cache info``.  ``export`` writes entries
to an archive another machine can ``import`` (a Raspberry Pi without
edgetpu_compiler then finds models compiled on an x86-64 machine); the
archive format is :mod:`coralrt._compile.cache_archive`.

The cache is the one :class:`~coralrt._compile.cache.CompileCache` uses by
default, so ``CORALRT_CACHE_DIR``, ``CORALRT_CACHE`` and
``CORALRT_CACHE_MAX_BYTES`` apply here too.
"""

from __future__ import annotations

import argparse
import logging

from coralrt import _config as config
from coralrt._cli._progress import Progress
from coralrt._cli._text import dumps, size_str, table
from coralrt._compile.cache import CompileCache
from coralrt._compile.cache_archive import ENTRY_MAX, export_cache
from coralrt._compile.cache_import import import_cache
from coralrt._compile.digest import model_digest
from coralrt.errors import CacheArchiveError

__all__ = ["add_parser", "command_info", "command_clear", "command_export", "command_import",
           "format_info", "format_import"]

log = logging.getLogger("coralrt.cache")


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "cache", parents=parents, help="show, clear, export or import the compile cache",
        description="Show, clear, export or import the on-disk cache of compiled Edge TPU "
                    "segments. "
                    "CORALRT_CACHE_DIR sets its folder, CORALRT_CACHE=0 turns it off, "
                    "CORALRT_CACHE_MAX_BYTES caps its size. Without an action: info.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=command_info)
    actions = p.add_subparsers(dest="cache_command", metavar="ACTION",
                               title="actions (default: info)")
    def action(name, func, help, description):
        a = actions.add_parser(name, parents=parents, help=help, description=description)
        # SUPPRESS: a --json given before the action (coralrt cache --json info) stays.
        a.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print one JSON object")
        a.set_defaults(func=func)
        return a

    action("info", command_info, "where the cache is, how many entries, how big",
           "Print the cache folder, whether the cache is enabled, the number of entries, "
           "their total size and the size cap.")
    action("clear", command_clear, "remove every cache entry",
           "Remove every entry of the compile cache; models are compiled again the next time "
           "they are loaded.")
    export = action(
        "export", command_export, "write cache entries to an archive file",
        "Write the entries of the compile cache (only those built from the given models, if "
        "any) to FILE, a tar archive (gzip-compressed when FILE ends with .tar.gz or .tgz) "
        "that 'coralrt cache import' reads on another machine.")
    export.add_argument("file", metavar="FILE", help="the archive to write (replaced if it "
                                                     "exists)")
    export.add_argument("models", metavar="MODEL", nargs="*",
                        help="only entries compiled from these .tflite files")
    imp = action(
        "import", command_import, "add the entries of an archive to the cache",
        "Verify the entries of an archive written by 'coralrt cache export' and store them in "
        "the compile cache. Nothing in the archive is extracted to a path or run; an entry "
        "that fails verification is skipped and reported (exit status 1). The digests in an "
        "archive prove it is intact, not who made it: import archives from machines you "
        "trust.")
    imp.add_argument("file", metavar="FILE", help="the archive to read")
    imp.add_argument("--max-entry-bytes", type=_size, default=None, metavar="SIZE",
                     help=f"refuse an archive declaring an entry larger than SIZE (bytes, or "
                          f"with a K, M or G suffix; default {ENTRY_MAX >> 20}M)")


def _size(text: str) -> int:
    size = config.parse_size(text)
    if size is None or size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (for example 512M)")
    return size


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


def command_export(args) -> int:
    cache = CompileCache()
    sources = None
    if args.models:
        sources = {model_digest(m, None)[0]: m for m in args.models}
    progress = Progress.for_args(args)
    with progress.bar(desc="exporting", unit="B", unit_scale=True) as bar:
        result = export_cache(cache, args.file, sources,
                              progress=progress.bytes_callback(bar) if progress.enabled
                              else None)
    if sources:
        found = {e["source"] for e in result["entries"]}
        for digest, model in sources.items():
            if digest not in found:
                log.warning("no cache entry was compiled from %s", model)
    if args.json:
        print(dumps(result))
        return 0
    print(f"exported {_entries(result['count'])} from {cache.root} to {result['file']}: "
          f"{size_str(result['total_bytes'])} of compiled data, archive "
          f"{size_str(result['archive_bytes'])}")
    return 0


def _entries(n: int) -> str:
    return f"{n:,} cache {'entry' if n == 1 else 'entries'}"


def _shown(value) -> str:
    """A manifest value (written by someone else) safe to print: one short line."""
    if value is None or value == "":
        return "?"
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= 60 else text[:57] + "..."


def format_import(report: dict) -> str:
    """The human-readable form of :func:`~coralrt._compile.cache_import.import_cache`."""
    a = report["archive"]
    n = len(report["entries"])
    lines = [f"imported {report['imported']:,} of {_entries(n)} from {report['file']} into "
             f"{report['directory']}",
             f"archive made by coralrt {_shown(a['coralrt_version'])} on {_shown(a['host'])} "
             f"({_shown(a['machine'])}) at {_shown(a['created'])}"]
    rows = []
    for e in report["entries"]:
        rows.append([e["status"], e["key"][:12], f"source {e['source'][:12]}",
                     _shown(e["description"].get("compiler")),
                     e.get("reason", size_str(e["size"]))])
    if rows:
        lines.append(table(None, rows))
    if report["present"]:
        lines.append(f"{report['present']:,} already present (kept as they were)")
    if report["evicted"]:
        lines.append(f"{_entries(report['evicted'])} removed to stay within the size cap "
                     f"(least recently used first)")
    return "\n".join(lines)


def command_import(args) -> int:
    report = import_cache(CompileCache(), args.file, max_entry_bytes=args.max_entry_bytes)
    print(dumps(report) if args.json else format_import(report))
    if report["failed"]:
        raise CacheArchiveError(
            f"{report['failed']:,} of {len(report['entries']):,} entries of {args.file} failed "
            f"verification and were not imported")
    return 0
