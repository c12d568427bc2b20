"""Terminal renderings (rich): the seed's table per run, the A/B verdict table, notes, and the calibration
table.

Pure functions of results; rendering at a fixed Console width gives the same text every time (golden tests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from tokbench.errors import InsufficientDataError
from tokbench.records import LevelResult, RunResult
from tokbench.stats.compare import LevelVerdict
from tokbench.stats.power import LevelCalibration
from tokbench.stats.summary import METRICS, LevelSummary, TrialFigures, summarize, trial_figures

VERDICT_STYLE = {
    "faster": "bold green",
    "slower": "bold red",
    "no_difference": "cyan",
    "inconclusive": "yellow",
    "insufficient_data": "dim",
}


def _digits(v: float) -> int:
    return 2 if abs(v) < 10 else 1


def _fmt(v: float | None, digits: int | None = None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.{_digits(v) if digits is None else digits}f}"


def _pm(mean: float, half_width: float | None, digits: int | None = None) -> str:
    """'mean' or 'mean±hw', the half-width at the mean's precision so the two read as one figure."""
    d = _digits(mean) if digits is None else digits
    return _fmt(mean, d) if half_width is None else f"{_fmt(mean, d)}±{_fmt(half_width, d)}"


def _mean_pm(values: Sequence[float], concurrency: int, metric: str, digits: int | None = None) -> str:
    """'mean' for one trial, 'mean ± 95% half-width' for several, '-' for none."""
    try:
        s = summarize(values, concurrency, metric)
    except InsufficientDataError:
        return "-"
    return _pm(s.mean, s.half_width, digits)


def _present(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


_SEED_NUMERIC = (
    "Agg tok/s",
    "Steady tok/s",
    "Per-req tok/s",
    "Tokens",
    "Wall(s)",
    "Ok",
    "TTFT p50 ms",
    "ITL p50 ms",
)
_SEED_CAPTION = "mean±95% CI half-width over K trials (Student t); Tokens, Wall(s) per trial; Ok summed"
_ONE_TRIAL_CAPTION = "one trial per level: no interval, and compare needs 2+ a side (run --trials 3 or more)"


def _level_cells(level: LevelResult) -> tuple[list[str], str, bool]:
    """(numeric cells in _SEED_NUMERIC order, flags and errors, client-limited?) of one level."""
    figs: list[TrialFigures] = [trial_figures(t) for t in level.trials]
    c = level.concurrency

    def col(values: Sequence[float | None], metric: str, digits: int | None = 1) -> str:
        return _mean_pm(_present(values), c, metric, digits)

    def per_trial(field: str, digits: int) -> str:
        # Imported tables may leave Tokens / Wall(s) / Ok out; they are stored as 0 there.
        values = [float(getattr(f, field)) for f in figs]
        if not figs or (imported and not any(values)):
            return "-"
        return _fmt(sum(values) / len(values), digits)

    imported = bool(figs) and all(f.imported for f in figs)
    errors: dict[str, int] = {}
    for f in figs:
        for kind, n in f.errors.items():
            errors[kind] = errors.get(kind, 0) + n
    limited = any(f.client_limited for f in figs)
    flags = ["client-limited"] if limited else []
    flags += ["interrupted"] if any(f.interrupted for f in figs) else []
    flags += ["retry"] if any(t.retry for t in level.trials) else []
    ok = sum(f.ok for f in figs)
    cells = [
        col([f.agg_tok_s for f in figs], "agg_tok_s"),
        col([f.steady_agg_tok_s for f in figs], "steady_agg_tok_s"),
        col([f.per_req_tok_s for f in figs], "per_req_tok_s"),
        per_trial("tokens", 0),
        per_trial("wall_s", 1),
        "-" if imported and ok == 0 else str(ok),
        col([f.ttft_ms.p50 for f in figs], "ttft_p50", None),
        col([f.itl_ms.p50 for f in figs], "itl_p50", None),
    ]
    return cells, "; ".join(flags + [f"{k} {n}" for k, n in sorted(errors.items())]), limited


def seed_table(run: RunResult) -> Table:
    """The seed's columns (C | Agg tok/s | Per-req tok/s | Tokens | Wall(s) | Ok) plus steady tok/s, TTFT
    and ITL p50, errors by kind and flags (client-limited, interrupted, retry). Columns without any value
    (an imported table's latencies) are left out.

    With several trials a level shows mean ± 95% CI half-width (Student t over trials); Tokens and Wall(s) are
    per-trial means and Ok the sum over trials."""
    show_trials = any(len(lv.trials) > 1 for lv in run.levels)
    rows = [(lv, *_level_cells(lv)) for lv in run.levels]
    keep = [k for k in range(len(_SEED_NUMERIC)) if any(r[1][k] != "-" for r in rows)]
    notes = any(r[2] for r in rows)
    imported = run.meta.source.startswith("import:")
    caption = _SEED_CAPTION if show_trials else None if imported else _ONE_TRIAL_CAPTION
    if imported:
        caption = f"imported from {run.meta.source[7:]}: summary figures only" + (
            f"; {caption}" if caption else ""
        )
    table = Table(title=run.meta.label or run.meta.run_id, caption=caption, box=box.SIMPLE_HEAD)
    table.add_column("C", justify="right", no_wrap=True)
    if show_trials:
        table.add_column("K", justify="right", no_wrap=True)
    for k in keep:
        table.add_column(_SEED_NUMERIC[k], justify="right", no_wrap=True)
    if notes:
        table.add_column("Flags, errors")
    for lv, cells, note, limited in rows:
        row: list[str | Text] = [str(lv.concurrency)]
        row += [str(len(lv.trials))] if show_trials else []
        row += [cells[k] for k in keep]
        row += [Text(note, style="bold red" if limited else "")] if notes else []
        table.add_row(*row)
    return table


# ---- verdicts ----------------------------------------------------------------------------------------------


def _side(s: LevelSummary | None) -> str:
    if s is None:
        return "-"
    return f"{_pm(s.mean, s.half_width)} (K={s.n_trials})"


def _pct(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.1f}%"


def _note(v: LevelVerdict) -> str:
    if v.verdict == "inconclusive":
        if v.trials_needed is None:
            return "needs >1000 trials/side"
        return f"needs ~{v.trials_needed} trials/side"
    return ""


def verdict_table(verdicts: Sequence[LevelVerdict], a_label: str, b_label: str) -> Table:
    """C | A | B | Change | 95% CI | Verdict | Note; faster/slower mean B better/worse on the metric."""
    metric = verdicts[0].metric if verdicts else "agg_tok_s"
    direction = "higher" if METRICS.get(metric, True) else "lower"
    margin = verdicts[0].margin_pct if verdicts else 2.0
    table = Table(
        title=f"{metric} ({direction} is better): B {b_label} vs A {a_label}, margin ±{margin:g}%",
        box=box.SIMPLE_HEAD,
    )
    for name in ("C", f"A: {a_label}", f"B: {b_label}", "Change", "95% CI"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("Verdict", no_wrap=True)
    notes = [_note(v) for v in verdicts]
    if any(notes):
        table.add_column("Note")
    for v, note in zip(verdicts, notes, strict=True):
        ci = "-" if v.ci_low_pct is None else f"[{_pct(v.ci_low_pct)}, {_pct(v.ci_high_pct)}]"
        row: list[str | Text] = [str(v.concurrency), _side(v.a), _side(v.b), _pct(v.delta_pct), ci]
        row.append(Text(v.verdict.replace("_", " "), style=VERDICT_STYLE.get(v.verdict, "")))
        table.add_row(*row, *([note] if any(notes) else []))
    return table


def verdict_notes(verdicts: Sequence[LevelVerdict]) -> list[str]:
    """Warnings and the paired per-prompt deltas, one line each, to print under the verdict table."""
    lines = []
    # The same warning at several levels is printed once, naming the levels.
    levels_by_warning: dict[str, list[int]] = {}
    for v in verdicts:
        for w in v.warnings:
            levels_by_warning.setdefault(w, []).append(v.concurrency)
    for w, levels in levels_by_warning.items():
        lines.append(f"C={','.join(map(str, levels))}: {w}")
    for v in verdicts:
        if v.paired:
            parts = []
            for p in v.paired:
                ci = "" if p.ci_low_ms is None else f" [{p.ci_low_ms:+.1f}, {p.ci_high_ms:+.1f}]"
                rel = "" if p.median_change_pct is None else f" ({p.median_change_pct:+.1f}%)"
                name = "E2E" if p.figure == "e2e_ms" else "TTFT"
                parts.append(f"{name} {p.median_delta_ms:+.1f} ms{ci}{rel}")
            lines.append(
                f"C={v.concurrency}: same prompts, paired per prompt (n={v.paired[0].n_pairs}), B-A median: "
                + "; ".join(parts)
            )
    return lines


# ---- calibration -------------------------------------------------------------------------------------------


def calibration_table(rows: Sequence[LevelCalibration], metric: str) -> Table:
    """Noise floor per level from an A/A run and what K trials per side can detect (80% power, alpha 0.05)."""
    detect = next((r.detect_pct for r in rows if r.detect_pct is not None), None)
    margin = rows[0].margin_pct if rows else 0.0
    table = Table(title=f"A/A calibration of {metric} (compare margin ±{margin:g}%)", box=box.SIMPLE_HEAD)
    for name in ("C", "Trials", "Mean", "CV %", "CV 95% upper %", "A/B CI ±% at K", "MDE % at K"):
        table.add_column(name, justify="right")
    if detect is not None:
        table.add_column(f"K for {detect:g}%", justify="right")
    table.add_column("Drift %", justify="right")
    for r in rows:
        cells = [
            str(r.concurrency),
            str(r.trials),
            _fmt(r.mean),
            _fmt(r.cv_pct, 2),
            _fmt(r.cv_upper_pct, 2),
            _fmt(r.half_width_pct, 2),
            _fmt(r.mde_pct, 2),
        ]
        if detect is not None:
            if r.trials_for_detect is not None:
                cells.append(str(r.trials_for_detect))
            else:  # a change inside the margin is no_difference however many trials
                cells.append("never" if detect <= r.margin_pct else ">1000")
        drift = "-" if r.drift_pct is None else f"{r.drift_pct:+.2f}"
        cells.append(drift + (" !" if r.drift_significant else ""))
        table.add_row(*cells)
    if any(r.drift_significant for r in rows):
        table.caption = (
            "! a significant trend across the trials (t test on the slope, alpha 0.01): the server was not "
            "steady, and the CV holds that trend as well as the noise"
        )
    return table
