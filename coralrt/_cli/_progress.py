"""Progress bars on stderr for long CLI work, drawn with tqdm (``coralrt[progress]``).

The library never draws or prints: it reports progress through callbacks
(``compile_model(on_plan=, on_segment=)``, ``export_cache(progress=)``) and
through the ``coralrt_compile_event`` hook (the JIT's ``segments_planned``,
``segment_compiled`` and ``compiled`` events).  This module turns those
into bars.  A :class:`Progress` is made per command with
:meth:`Progress.for_args`; it draws nothing when stderr is not a terminal,
with ``--json`` or ``-q/--quiet``, or when tqdm is not installed.  A bar
appears only once its work has taken :data:`DELAY` seconds, so quick work
shows nothing.

Sessions the CLI creates get the bar through an observer plugin::

    InferenceSession(path, target="sim", plugins=progress.plugins())

``plugins()`` is ``[]`` when the bars are off, so the session is then
exactly what it would be without this module.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from coralrt.plugins._hookspecs import hookimpl

__all__ = ["DELAY", "Progress", "CompileObserver"]

#: Seconds a piece of work must last before its bar appears (tqdm's ``delay``).
DELAY = 1.0


def _tqdm():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class _NoBar:
    """What :meth:`Progress.bar` yields when nothing is drawn."""

    n = 0
    total = None

    def update(self, n: int = 1) -> None:
        pass

    def set_total(self, total: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Bar:
    def __init__(self, bar) -> None:
        self._bar = bar

    @property
    def n(self):
        return self._bar.n

    @property
    def total(self):
        return self._bar.total

    def update(self, n: int = 1) -> None:
        if self._bar.total is not None and self._bar.n + n > self._bar.total:
            self._bar.total = self._bar.n + n   # more work than planned (a split segment)
        self._bar.update(n)

    def set_total(self, total: int) -> None:
        self._bar.total = total
        self._bar.refresh()

    def finish(self) -> None:
        """The work is done: the bar shows its total (some planned work may have
        turned out unnecessary, such as operators moved to the CPU)."""
        if self._bar.total is not None and self._bar.n < self._bar.total:
            self._bar.update(self._bar.total - self._bar.n)

    def close(self) -> None:
        self._bar.close()


class Progress:
    """Makes bars on ``stream`` (default: ``sys.stderr`` when a bar is made), or none."""

    def __init__(self, *, disable: bool = False, stream=None) -> None:
        self._stream = stream
        self._tqdm = None if disable else _tqdm()

    @classmethod
    def for_args(cls, args, stream=None) -> "Progress":
        """Bars for a command: off with ``--json``, ``-q``, or stderr not a terminal."""
        stream = stream if stream is not None else sys.stderr
        try:
            tty = bool(stream.isatty())
        except (AttributeError, ValueError):   # no isatty, or a closed stream
            tty = False
        quiet = getattr(args, "quiet", False) or getattr(args, "json", False)
        return cls(disable=quiet or not tty, stream=stream)

    @property
    def enabled(self) -> bool:
        return self._tqdm is not None

    def new_bar(self, *, total: int | None = None, desc: str = "", unit: str = "it",
                unit_scale: bool = False):
        """An open bar (close it), or a stand-in that draws nothing."""
        if self._tqdm is None:
            return _NoBar()
        stream = self._stream if self._stream is not None else sys.stderr
        return _Bar(self._tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale,
                               file=stream, delay=DELAY, leave=True, dynamic_ncols=True))

    @contextmanager
    def bar(self, **kwargs):
        bar = self.new_bar(**kwargs)
        try:
            yield bar
        finally:
            bar.close()

    def plugins(self) -> list:
        """The observer plugin for ``InferenceSession(..., plugins=...)``, or ``[]``."""
        return [CompileObserver(self)] if self.enabled else []

    def bytes_callback(self, bar):
        """A ``progress(done, total)`` callback (bytes) that moves ``bar``."""
        def progress(done: int, total: int) -> None:
            if bar.total != total:
                bar.set_total(total)
            bar.update(done - bar.n)
        return progress


class CompileObserver:
    """A plugin observing the JIT (``coralrt_compile_event``): one bar per cold
    compile, counting the Edge TPU operators compiled."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._bar = None

    @hookimpl
    def coralrt_compile_event(self, event: dict) -> None:
        kind = event.get("kind")
        if kind == "segments_planned":
            self._close()
            self._bar = self._progress.new_bar(total=event.get("operators") or 0,
                                               desc="compiling Edge TPU segments", unit="op")
        elif kind == "segment_compiled" and self._bar is not None:
            self._bar.update(event.get("operators") or 0)
        elif kind == "compiled" and self._bar is not None:
            self._bar.finish()
            self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
