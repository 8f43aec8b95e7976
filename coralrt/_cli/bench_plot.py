"""``coralrt bench --plot OUT.png``: the per-run latencies as a picture.

One box plot per series with every run drawn over it as a dot: the host time
of each timed run on the chosen target and, on ``--target sim``, the Coral
USB Accelerator time coralrt's latency model estimates for that run's Edge
TPU steps.  The two can differ by orders of magnitude (the simulator computes
on this host's CPU), so the axis turns logarithmic when they do.

matplotlib is the optional extra ``coralrt[plot]``: imported only here, only
when a plot is asked for, with the non-interactive Agg backend (no display
needed).
"""

from __future__ import annotations

import inspect
import statistics
from pathlib import PurePath

from coralrt.errors import ConfigError

__all__ = ["PLOT_HINT", "require_matplotlib", "plot_latencies"]

PLOT_HINT = "pip install 'coralrt[plot]'"


def require_matplotlib():
    """matplotlib's pyplot on the Agg backend, or a ConfigError saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ConfigError(f"--plot needs matplotlib, which the plot extra installs: "
                          f"{PLOT_HINT} ({e})") from None
    return plt


def plot_latencies(path, *, model: str, target: str, host_ms: list[float],
                   device_ms: list[float] | None = None, usb: str | None = None) -> None:
    """Write the PNG ``path``: ``host_ms`` per run and, when given, ``device_ms``
    (the estimated Edge TPU time of the same runs)."""
    plt = require_matplotlib()
    from matplotlib import ticker
    series = [(f"host time per run\n(target {target}, this machine)", host_ms, "#4e79a7")]
    if device_ms:
        series.append((f"estimated Coral USB Accelerator\ntime of the Edge TPU steps ({usb})",
                       device_ms, "#f28e2b"))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 1.5 * len(series)), dpi=110)
    try:
        positions = list(range(len(series), 0, -1))   # first series on top
        # matplotlib 3.10 renamed vert=False to orientation="horizontal".
        horizontal = ({"orientation": "horizontal"} if "orientation" in
                      inspect.signature(ax.boxplot).parameters else {"vert": False})
        ax.boxplot([s[1] for s in series], positions=positions, widths=0.5,
                   showfliers=False, medianprops={"color": "#222222"}, **horizontal)
        for pos, (_, values, colour) in zip(positions, series):
            n = len(values)
            # A deterministic spread (no random jitter): runs in order, bottom to top.
            ys = [pos - 0.18 + 0.36 * (k + 0.5) / n for k in range(n)]
            ax.scatter(values, ys, s=14, color=colour, alpha=0.75, zorder=3,
                       edgecolors="none")
            med = statistics.median(values)
            ax.annotate(f"median {med:.3f} ms", (med, pos + 0.3), ha="center",
                        va="bottom", fontsize=9)
        ax.set_yticks(positions)
        ax.set_yticklabels([s[0] for s in series], fontsize=9)
        ax.set_ylim(0.4, len(series) + 0.75)
        lows = [min(s[1]) for s in series]
        highs = [max(s[1]) for s in series]
        if min(lows) > 0 and max(highs) / min(lows) > 20:
            ax.set_xscale("log")
            ax.set_xlabel("milliseconds (log scale)")
            # Plain numbers (2, 5, 10, 20 ...) rather than powers of ten.
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        else:
            ax.set_xlabel("milliseconds")
        ax.grid(axis="x", alpha=0.3)
        title = f"{PurePath(model).name}: {len(host_ms)} timed runs on {target}"
        if device_ms:
            title += "\nthe Coral time is an estimate of coralrt's latency model, not a measurement"
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
