"""Benchmark plots (matplotlib, headless): series over time with events marked."""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MARK_COLOURS = ("red", "purple", "green", "black")


def rate_series(
    samples: Sequence[tuple[float, int]], t0: float, window_s: float = 0.0
) -> tuple[list[float], list[float]]:
    """Records/s at each (time, count) sample, at seconds since `t0`: over the trailing
    `window_s` seconds, or since the previous sample when 0. Transactions make the output
    arrive a whole micro-batch at a time, so per-sample rates swing between zero and twice
    the throughput; a window of a few batches shows the rate a reader can see."""
    xs: list[float] = []
    ys: list[float] = []
    times = [t for t, _ in samples]
    for i, (t2, n2) in enumerate(samples):
        # The newest sample at least `window_s` older; none before a whole window.
        j = min(bisect.bisect_right(times, t2 - window_s) - 1, i - 1) if window_s else i - 1
        if j < 0:
            continue
        t1, n1 = samples[j]
        if t2 > t1:
            xs.append(t2 - t0)
            ys.append((n2 - n1) / (t2 - t1))
    return xs, ys


def mark_styles(marks: Sequence[tuple[float, str]]) -> list[tuple[float, str, str | None]]:
    """(x, colour, legend entry) per mark: one colour and one legend entry per kind of mark
    (kill, sigstop, persist...), so a run with several kinds tells them apart."""
    colours: dict[str, str] = {}
    styles: list[tuple[float, str, str | None]] = []
    for x, mark in marks:
        first = mark not in colours
        if first:
            colours[mark] = MARK_COLOURS[len(colours) % len(MARK_COLOURS)]
        styles.append((x, colours[mark], mark if first else None))
    return styles


def plot(
    path: Path,
    title: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    ylabel: str,
    marks: Sequence[tuple[float, str]] = (),
    xlabel: str = "seconds",
    second: tuple[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]] | None = None,
    logx: bool = False,
    marker: str | None = None,
) -> Path:
    """One panel (two with `second`: its y label and series), vertical lines at `marks`;
    `logx` for a logarithmic x axis, `marker` to show each point (a series of a few)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if second else 1
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.2 * panels), sharex=True, squeeze=False)
    groups = [(ylabel, series)] + ([second] if second else [])
    for ax, (label, lines) in zip(axes[:, 0], groups, strict=True):
        for name, (xs, ys) in lines.items():
            ax.plot(xs, ys, label=name, linewidth=1, marker=marker)
        for x, colour, legend in mark_styles(marks):
            ax.axvline(x, color=colour, alpha=0.5, linewidth=0.8, label=legend)
        if logx:
            ax.set_xscale("log")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel(xlabel)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_drains(path: Path, title: str, samples: Mapping[str, Sequence[tuple[float, int]]]) -> Path:
    """Output rate over time of each drain of one backlog (label -> its output samples),
    every one from its own first output: start-ups left out alike."""
    series = {}
    for label, points in samples.items():
        first = next(t for t, n in points if n > 0)
        series[label] = rate_series(points, first, window_s=5.0)
    return plot(
        path,
        title,
        series,
        "output events/s (5 s average)",
        xlabel="seconds since the first output",
    )


def write_figures(output: Path, name: str, figures: Mapping[str, Any], echo: bool = True) -> Path:
    """A run's figures as `<output>/<name>.json` (printed first, unless `echo` is off)."""
    text = json.dumps(figures, indent=2)
    if echo:
        print(text)
    output.mkdir(parents=True, exist_ok=True)
    path = output / f"{name}.json"
    path.write_text(text + "\n")
    return path
