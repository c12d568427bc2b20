"""Markdown report for a pull request: the seed's table per run, verdicts, speculative accounting and the
configuration diff.

The row builders here (seed, verdict, acceptance rows, config diff) also feed the HTML report, so both say
the same thing. Every number is a pure function of the runs' records and scrapes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokbench.errors import InsufficientDataError
from tokbench.records import LevelResult, RunResult
from tokbench.server.engines import VOLATILE
from tokbench.spec.scrape import Acceptance, level_acceptance
from tokbench.stats.compare import LevelVerdict
from tokbench.stats.summary import METRICS, LevelSummary, TrialFigures, summarize, trial_figures

# run label -> concurrency -> what is known of acceptance there: an Acceptance, or just per-position rates.
SpecInput = Mapping[str, Mapping[int, Acceptance | Sequence[float]]]
VerdictInput = Mapping[str, Sequence[LevelVerdict]]

_DIFF_VALUE_MAX = 60  # characters of a configuration value shown before it is cut with "..."


# ---- formatting --------------------------------------------------------------------------------------------


def fmt(v: float | None, digits: int | None = None) -> str:
    """A figure at a precision that suits its size ('-' for none): 2 decimals under 10, else 1."""
    if v is None or not math.isfinite(v):
        return "-"
    d = digits if digits is not None else (2 if abs(v) < 10 else 1)
    return f"{v:.{d}f}"


def fmt_pm(s: LevelSummary | None, digits: int | None = None) -> str:
    """'mean ± 95% half-width', or the mean alone for a single trial."""
    if s is None:
        return "-"
    d = digits if digits is not None else (2 if abs(s.mean) < 10 else 1)
    return fmt(s.mean, d) if s.half_width is None else f"{fmt(s.mean, d)} ± {fmt(s.half_width, d)}"


def pct(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.1f}%"


def run_name(run: RunResult) -> str:
    return run.meta.label or run.meta.run_id


# ---- the seed's table --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedRow:
    """One level of one run: the seed's figures as mean (± 95% CI half-width over K trials)."""

    concurrency: int
    trials: int
    agg: LevelSummary | None
    per_req: LevelSummary | None
    steady: LevelSummary | None
    tokens: float | None  # mean per trial
    wall_s: float | None  # mean per trial
    ok: int  # summed over trials
    requests: int
    ttft_p50: LevelSummary | None
    itl_p50: LevelSummary | None
    notes: tuple[str, ...]


def _summary(c: int, metric: str, values: Sequence[float | None]) -> LevelSummary | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    try:
        return summarize(present, c, metric)
    except InsufficientDataError:
        return None


def seed_row(level: LevelResult) -> SeedRow:
    figs: list[TrialFigures] = [trial_figures(t) for t in level.trials]
    c = level.concurrency
    errors: dict[str, int] = {}
    for f in figs:
        for kind, n in f.errors.items():
            errors[kind] = errors.get(kind, 0) + n
    notes = [
        flag
        for flag, on in (
            ("client-limited", any(f.client_limited for f in figs)),
            ("interrupted", any(f.interrupted for f in figs)),
            ("retry", any(t.retry for t in level.trials)),
            ("imported", any(f.imported for f in figs)),
        )
        if on
    ]
    notes += [f"{kind} ×{n}" for kind, n in sorted(errors.items())]
    measured = [f for f in figs if not f.imported]
    return SeedRow(
        concurrency=c,
        trials=len(figs),
        agg=_summary(c, "agg_tok_s", [f.agg_tok_s for f in figs]),
        per_req=_summary(c, "per_req_tok_s", [f.per_req_tok_s for f in figs]),
        steady=_summary(c, "steady_agg_tok_s", [f.steady_agg_tok_s for f in figs]),
        tokens=sum(f.tokens for f in figs) / len(figs) if figs else None,
        wall_s=sum(f.wall_s for f in figs) / len(figs) if figs else None,
        ok=sum(f.ok for f in figs),
        requests=sum(f.requests for f in measured) + sum(f.ok for f in figs if f.imported),
        ttft_p50=_summary(c, "ttft_p50", [f.ttft_ms.p50 for f in figs]),
        itl_p50=_summary(c, "itl_p50", [f.itl_ms.p50 for f in figs]),
        notes=tuple(notes),
    )


def seed_rows(run: RunResult) -> list[SeedRow]:
    return [seed_row(lv) for lv in run.levels]


SEED_HEADER = (
    "C", "K", "Agg tok/s", "Per-req tok/s", "Tokens", "Wall(s)", "Ok", "TTFT p50 ms", "ITL p50 ms", "Notes",
)  # fmt: skip


def seed_cells(row: SeedRow) -> list[str]:
    return [
        str(row.concurrency),
        str(row.trials),
        fmt_pm(row.agg, 1),
        fmt_pm(row.per_req, 1),
        fmt(row.tokens, 0),
        fmt(row.wall_s, 1),
        f"{row.ok}/{row.requests}" if row.requests != row.ok else str(row.ok),
        fmt_pm(row.ttft_p50),
        fmt_pm(row.itl_p50),
        ", ".join(row.notes),
    ]


# ---- verdicts ----------------------------------------------------------------------------------------------


def split_title(title: str, runs: Sequence[RunResult]) -> tuple[str, str]:
    """(A label, B label) of a verdict group: 'B vs A', or a bare B label against the first run."""
    if " vs " in title:
        b, a = title.split(" vs ", 1)
        return a, b
    return (run_name(runs[0]) if runs else "A"), title


def verdict_note(v: LevelVerdict) -> str:
    parts = []
    if v.verdict == "inconclusive":
        parts.append(
            f"~{v.trials_needed} trials/side would decide"
            if v.trials_needed
            else "over 1000 trials/side to decide"
        )
    if v.verdict == "insufficient_data":
        parts.append("needs 2+ trials a side")
    parts += list(v.warnings)
    return "; ".join(parts)


VERDICT_HEADER = ("C", "A", "B", "Change", "95% CI", "Verdict", "Note")


def verdict_cells(v: LevelVerdict) -> list[str]:
    ci = "-" if v.ci_low_pct is None else f"[{pct(v.ci_low_pct)}, {pct(v.ci_high_pct)}]"
    return [
        str(v.concurrency),
        fmt_pm(v.a),
        fmt_pm(v.b),
        pct(v.delta_pct),
        ci,
        v.verdict.replace("_", " "),
        verdict_note(v),
    ]


def verdict_caption(verdicts: Sequence[LevelVerdict], a_label: str, b_label: str) -> str:
    metric = verdicts[0].metric if verdicts else "agg_tok_s"
    direction = "higher" if METRICS.get(metric, True) else "lower"
    margin = verdicts[0].margin_pct if verdicts else 2.0
    return (
        f"B = {b_label} vs A = {a_label} on {metric} ({direction} is better); change of B vs A with "
        f"its 95% CI over trials; no difference = the CI lies inside ±{margin:g}%"
    )


# ---- speculative accounting --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecRow:
    concurrency: int
    per_position: tuple[float, ...]
    length: float | None = None  # tokens per target step (or mean accepted length), bonus token included
    acceptance_rate: float | None = None
    verify_steps_per_s: float | None = None
    source: str = ""


def spec_rows(runs: Sequence[RunResult], spec: SpecInput | None = None) -> dict[str, list[SpecRow]]:
    """Acceptance per run and level: as given in `spec`, else computed from each run's scrapes and extras.
    Runs (or levels) with no speculative data are left out."""
    out: dict[str, list[SpecRow]] = {}
    if spec is not None:
        for label, levels in spec.items():
            rows = [_spec_row(c, a) for c, a in sorted(levels.items())]
            if rows:
                out[label] = rows
        return out
    for run in runs:
        rows = []
        for lv in run.levels:
            acc = level_acceptance(lv)
            if acc is not None and acc.engaged:
                rows.append(_spec_row(lv.concurrency, acc))
        if rows:
            out[run_name(run)] = rows
    return out


def _spec_row(c: int, a: Acceptance | Sequence[float]) -> SpecRow:
    if isinstance(a, Acceptance):
        return SpecRow(c, a.per_position, a.length, a.acceptance_rate, a.verify_steps_per_s, a.source)
    return SpecRow(c, tuple(float(x) for x in a))


SPEC_HEADER = ("C", "L (tokens/step)", "Acceptance", "Verify steps/s", "Per position", "Source")


def spec_cells(r: SpecRow) -> list[str]:
    return [
        str(r.concurrency),
        fmt(r.length),
        "-" if r.acceptance_rate is None else f"{100 * r.acceptance_rate:.1f}%",
        fmt(r.verify_steps_per_s),
        " ".join(f"{p:.2f}" for p in r.per_position) or "-",
        r.source or "-",
    ]


# ---- configuration diff ------------------------------------------------------------------------------------


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay whole values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def show_value(v: Any, limit: int = _DIFF_VALUE_MAX) -> str:
    """A configuration value as short text: strings as they are, the rest as compact JSON, cut at `limit`."""
    if v is None:
        return "-"
    text = v if isinstance(v, str) else json.dumps(v, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MISSING = object()


# Facts of one launch or one run, not configuration: every pair of runs differs in them.
_NOT_CONFIG = ("server.name", "server.launches", "server.failed_attempts", "load.label", "load.base_url")


def _is_config(key: str) -> bool:
    if key.startswith(_NOT_CONFIG):
        return False
    # Ports, seeds, clocks and live counters in the resolved configuration: the campaign skips them too.
    return not (key.startswith("server.resolved.") and VOLATILE.search(key[len("server.resolved.") :]))


def diff_configs(runs: Sequence[RunResult]) -> list[tuple[str, list[str]]]:
    """Keys of the resolved server configuration and the load settings whose values differ between runs, with
    each run's value ('-' where a run lacks the key). Per-launch facts (ports, seeds, live counters) are not
    configuration and are left out."""
    flat = []
    for r in runs:
        facts = {**flatten(r.meta.server, "server."), **flatten(r.meta.load, "load."), "model": r.meta.model}
        flat.append({k: v for k, v in facts.items() if _is_config(k)})
    keys = sorted(set().union(*flat)) if flat else []
    rows = []
    for key in keys:
        values = [f.get(key, _MISSING) for f in flat]
        if (
            len({json.dumps(v, sort_keys=True, default=str) if v is not _MISSING else "\0" for v in values})
            > 1
        ):
            rows.append((key, ["-" if v is _MISSING else show_value(v) for v in values]))
    return rows


# ---- markdown ----------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: int | None = None) -> str:
    """A GitHub table; columns before index `right` (all if None) are right-aligned numbers."""
    n = len(header) if right is None else right
    align = ["---:" if i < n else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_report(
    runs: Sequence[RunResult],
    verdicts: VerdictInput | None = None,
    spec: SpecInput | None = None,
    config_diff: Sequence[tuple[str, Sequence[str]]] | None = None,
) -> str:
    """The report as GitHub markdown. `verdicts` maps 'B vs A' (or B's label, against the first run) to the
    verdicts per level; `spec` overrides the acceptance computed from the runs."""
    out: list[str] = ["## tokbench results", ""]
    multi = any(len(lv.trials) > 1 for r in runs for lv in r.levels)
    for run in runs:
        m = run.meta
        status = "" if m.complete else " — **incomplete run** (interrupted; figures cover finished requests)"
        out.append(f"### {run_name(run)}{status}")
        out.append("")
        facts = [f"run `{m.run_id}`", f"model `{m.model}`" if m.model else "", m.started_at, m.api]
        out.append(" · ".join(f for f in facts if f))
        out.append("")
        out.append(md_table(SEED_HEADER, [seed_cells(r) for r in seed_rows(run)], right=9))
        out.append("")
    if multi:
        out.append(
            "_K trials per level: mean ± 95% CI half-width over trials (Student t); Tokens and Wall(s) "
            "are per-trial means; Ok is summed over trials._"
        )
        out.append("")
    if verdicts:
        out.append("### Verdicts")
        out.append("")
        for title, vs in verdicts.items():
            a_label, b_label = split_title(title, runs)
            out.append(f"**{b_label} vs {a_label}**: {verdict_caption(vs, a_label, b_label)}")
            out.append("")
            out.append(md_table(VERDICT_HEADER, [verdict_cells(v) for v in vs], right=5))
            out.append("")
    accounting = spec_rows(runs, spec)
    if accounting:
        out.append("### Speculative decoding")
        out.append("")
        out.append(
            "_L = output tokens per target step (bonus token included); per position = share of drafts "
            "whose i-th token was accepted; run-scoped (deltas around each measurement window)._"
        )
        out.append("")
        for label, rows in accounting.items():
            out.append(f"**{label}**")
            out.append("")
            out.append(md_table(SPEC_HEADER, [spec_cells(r) for r in rows], right=4))
            out.append("")
    diff = diff_configs(runs) if config_diff is None else config_diff
    if len(runs) > 1 or config_diff is not None:
        out.append("### Configuration differences")
        out.append("")
        if diff:
            header = ("Key", *(run_name(r) for r in runs))
            out.append(md_table(header, [(k, *vals) for k, vals in diff], right=0))
        else:
            out.append("Resolved server configuration and load settings are identical.")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
