"""Plots for the HTML report, drawn with matplotlib (no pyplot state) and returned as inline SVG text.

Each function takes runs (or plain numbers) and returns one `<svg>` element, or None when there is nothing to
draw. Element ids are prefixed per plot so several SVGs can share one HTML document.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from tokbench.errors import InsufficientDataError
from tokbench.records import LevelResult, RunResult
from tokbench.stats.summary import LevelSummary, itl_values, level_summary

# Text stays text (smaller files, selectable, crisp); a fixed hash salt makes the same runs give the same SVG.
_RC: dict[Any, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "tokbench",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _label(run: RunResult) -> str:
    return run.meta.label or run.meta.run_id


def to_svg(fig: Figure, prefix: str) -> str:
    """The figure as one <svg> element (no XML prolog), its ids prefixed with `prefix`."""
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', svg)
    svg = svg.replace("url(#", f"url(#{prefix}-").replace('href="#', f'href="#{prefix}-')
    return svg


def _figure(width: float = 7.5, height: float = 3.6) -> Figure:
    with matplotlib.rc_context(_RC):
        return Figure(figsize=(width, height), layout="constrained")


def _concurrency_axis(ax: Axes, levels: Sequence[int]) -> None:
    ticks = sorted(set(levels))
    if ticks and ticks[0] > 0 and ticks[-1] / ticks[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(c) for c in ticks])
    ax.set_xlabel("concurrency")


def _summary(level: LevelResult, metric: str) -> LevelSummary | None:
    try:
        return level_summary(level, metric)
    except InsufficientDataError:
        return None


def throughput_svg(runs: Sequence[RunResult]) -> str | None:
    """Aggregate tok/s vs concurrency per run: mean over trials, shaded 95% CI where there are 2+ trials."""
    series = []
    for run in runs:
        pts = [(lv.concurrency, s) for lv in run.levels if (s := _summary(lv, "agg_tok_s")) is not None]
        if pts:
            series.append((run, pts))
    if not series:
        return None
    fig = _figure()
    with matplotlib.rc_context(_RC):
        ax = fig.subplots()
        for i, (run, pts) in enumerate(series):
            xs = [c for c, _ in pts]
            ax.plot(xs, [s.mean for _, s in pts], marker="o", color=color(i), label=_label(run))
            lo = [s.ci_low if s.ci_low is not None else np.nan for _, s in pts]
            hi = [s.ci_high if s.ci_high is not None else np.nan for _, s in pts]
            if not all(math.isnan(v) for v in lo):
                ax.fill_between(
                    xs, lo, hi, color=color(i), alpha=0.2, linewidth=0, label=f"{_label(run)} 95% CI"
                )
        _concurrency_axis(ax, [c for _, pts in series for c, _ in pts])
        ax.set_ylabel("aggregate tok/s")
        top = max(max(s.mean, s.ci_high or 0.0) for _, pts in series for _, s in pts)
        ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)  # from zero, with room above the highest band
        ax.set_title("Aggregate throughput vs concurrency")
        ax.legend(loc="best", fontsize=8)
    return to_svg(fig, "thr")


def tradeoff_svg(runs: Sequence[RunResult]) -> str | None:
    """Per-request tok/s against aggregate tok/s, one point per level: what each user gets for the total."""
    series = []
    for run in runs:
        pts = []
        for lv in run.levels:
            agg, per = _summary(lv, "agg_tok_s"), _summary(lv, "per_req_tok_s")
            if agg is not None and per is not None:
                pts.append((lv.concurrency, agg.mean, per.mean))
        if pts:
            series.append((run, pts))
    if not series:
        return None
    fig = _figure()
    with matplotlib.rc_context(_RC):
        ax = fig.subplots()
        for i, (run, pts) in enumerate(series):
            ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", color=color(i), label=_label(run))
            for c, x, y in pts:
                ax.annotate(
                    f"C={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color(i)
                )
        ax.set_xlabel("aggregate tok/s")
        ax.set_ylabel("per-request tok/s")
        # From zero (the trade-off reads as shares of the axes), with room for the C= labels.
        xmax = max(p[1] for _, pts in series for p in pts)
        ymax = max(p[2] for _, pts in series for p in pts)
        ax.set_xlim(0, xmax * 1.12 if xmax > 0 else 1.0)
        ax.set_ylim(0, ymax * 1.15 if ymax > 0 else 1.0)
        ax.set_title("Trade-off: per-request vs aggregate throughput")
        ax.legend(loc="best", fontsize=8)
    return to_svg(fig, "trade")


def latency_values(level: LevelResult) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT ms per OK request, ITL ms per token) pooled over the level's trials."""
    ok = [r for t in level.trials for r in t.measured if r.ok]
    ttft = np.asarray([(r.first_token_ns - r.sent_ns) / 1e6 for r in ok if r.first_token_ns is not None])
    itl = np.concatenate([itl_values(r) for r in ok]) / 1e6 if ok else np.empty(0)
    return ttft, itl


def latency_svg(runs: Sequence[RunResult]) -> str | None:
    """TTFT and ITL distributions per level as box plots (box: quartiles, whiskers: p5..p95), one box per
    run side by side."""
    levels = sorted({lv.concurrency for r in runs for lv in r.levels})
    data: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for i, run in enumerate(runs):
        for lv in run.levels:
            data[(i, lv.concurrency)] = latency_values(lv)
    if not any(v[0].size for v in data.values()):
        return None
    fig = _figure(height=3.4)
    width = 0.8 / max(len(runs), 1)
    with matplotlib.rc_context(_RC):
        axes = fig.subplots(1, 2)
        for k, (ax, name) in enumerate(zip(axes, ("TTFT (ms)", "ITL per token (ms)"), strict=True)):
            top = 0.0
            low = math.inf
            for i, run in enumerate(runs):
                pos, vals = [], []
                for j, c in enumerate(levels):
                    v = data.get((i, c), (np.empty(0), np.empty(0)))[k]
                    if v.size:
                        pos.append(j + (i - (len(runs) - 1) / 2) * width)
                        vals.append(v)
                        top = max(top, float(np.percentile(v, 95)))
                        low = min(low, float(np.percentile(v, 5)))
                if not vals:
                    continue
                ax.boxplot(
                    vals, positions=pos, widths=width * 0.85, whis=(5, 95), showfliers=False,
                    patch_artist=True, boxprops={"facecolor": color(i), "alpha": 0.45, "edgecolor": color(i)},
                    medianprops={"color": color(i)}, whiskerprops={"color": color(i)},
                    capprops={"color": color(i)},
                )  # fmt: skip
                ax.plot([], [], color=color(i), linewidth=6, alpha=0.45, label=_label(run))
            if low > 0 and top / low > 50:
                ax.set_yscale("log")
            ax.set_xticks(range(len(levels)))
            ax.set_xticklabels([str(c) for c in levels])
            ax.set_xlabel("concurrency")
            ax.set_title(name)
        axes[0].legend(loc="best", fontsize=8)
    return to_svg(fig, "lat")


def acceptance_svg(per_position: Mapping[str, Mapping[int, Sequence[float]]]) -> str | None:
    """Speculative acceptance per draft position: one line per run and level (run label -> C -> rates)."""
    series = [
        (label, c, rates) for label, levels in per_position.items() for c, rates in levels.items() if rates
    ]
    if not series:
        return None
    fig = _figure(height=3.2)
    labels = list(dict.fromkeys(label for label, _, _ in series))
    styles = ("-", "--", ":", "-.")
    with matplotlib.rc_context(_RC):
        ax = fig.subplots()
        for label, c, rates in series:
            i = labels.index(label)
            levels = sorted(per_position[label])
            ax.plot(
                range(1, len(rates) + 1), rates, marker="o", color=color(i),
                linestyle=styles[levels.index(c) % len(styles)], label=f"{label} C={c}",
            )  # fmt: skip
        longest = max(len(r) for _, _, r in series)
        ax.set_xticks(range(1, longest + 1))
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted share of drafts")
        ax.set_ylim(0, 1.05)
        ax.set_title("Speculative acceptance per position")
        ax.legend(loc="best", fontsize=8)
    return to_svg(fig, "acc")
