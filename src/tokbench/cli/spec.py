"""CLI: `tokbench spec BASELINE SPEC` (speculative accounting, diagnosis and lossless check of two runs) and
`tokbench spec-model` (what-if from the speedup model, or `--fit` of its draft cost and knee to two runs).

Throughput and verdicts come from tokbench.stats, so S here is the same figure `tokbench compare` prints.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from tokbench.config import parse_levels
from tokbench.errors import ConfigError, InsufficientDataError
from tokbench.records import RunResult, TrialResult
from tokbench.server.engines import changed_flags, config_diff, json_safe
from tokbench.spec.diagnose import LevelDiagnosis, diagnose, level_throughput
from tokbench.spec.lossless import LosslessResult, lossless_check
from tokbench.spec.model import Fit, alpha_positions, fit, predict, step_cost
from tokbench.spec.scrape import Acceptance, acceptance_to_dict, level_acceptance
from tokbench.stats.compare import compare_runs
from tokbench.stats.summary import metric_value, trial_figures
from tokbench.store import load_run_arg

# Throughput figures a speedup can be taken of.
SPEEDUP_METRICS = ("agg_tok_s", "steady_agg_tok_s", "per_req_tok_s")
_POSITIONS_SHOWN = 4


def _console() -> Console:
    # Off a terminal (pipes, CI logs, tests) rich would wrap at 80 columns; these tables need more.
    probe = Console()
    return probe if probe.is_terminal else Console(width=160, no_color=True)


def _throughput(metric: str) -> Any:
    def value(t: TrialResult) -> float | None:
        return metric_value(trial_figures(t), metric)

    return value


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _positions(acc: Acceptance | None) -> str:
    if acc is None or not acc.per_position:
        return "-"
    shown = ",".join(f"{p:.2f}" for p in acc.per_position[:_POSITIONS_SHOWN])
    more = len(acc.per_position) - _POSITIONS_SHOWN
    return f"{shown},…(+{more})" if more > 0 else shown


def _load(arg: str, db: str | None) -> RunResult:
    return load_run_arg(arg, db)


# ---- tokbench spec --------------------------------------------------------------------------------


def accounting_table(diags: Sequence[LevelDiagnosis], metric: str) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=f"Speculative accounting (S from {metric})")
    for name in ("C", "L tok/step", "mean acc len", "accept", "per-position", "steps/s"):
        t.add_column(name, justify="right")
    for name in ("baseline", "spec", "S", "r = L/S", "source"):
        t.add_column(name, justify="right" if name != "source" else "left")
    for d in diags:
        a = d.acceptance
        t.add_row(
            str(d.concurrency),
            _f(d.length),
            _f(a.mean_accepted_length if a else None),
            _f(a.acceptance_rate * 100 if a and a.acceptance_rate is not None else None, ".1f") + "%",
            _positions(a),
            _f(a.verify_steps_per_s if a else None, ".1f"),
            _f(d.baseline_tok_s, ".1f"),
            _f(d.spec_tok_s, ".1f"),
            _f(d.speedup),
            _f(d.step_cost),
            a.source if a else "none",
        )
    return t


def diagnosis_lines(diags: Sequence[LevelDiagnosis]) -> list[str]:
    """One line per finding; a run-wide finding (configuration drift) once, after the levels."""
    lines, run_wide = [], []
    for d in diags:
        for f in d.findings:
            if f.check == "config_drift":
                if f.message not in run_wide:
                    run_wide.append(f.message)
                continue
            lines.append(f"C={d.concurrency}: {f.message}")
        if d.acceptance is not None:
            lines.extend(f"C={d.concurrency}: note: {n}" for n in d.acceptance.notes)
    return lines + [f"all levels: {m}" for m in run_wide]


def lossless_lines(res: LosslessResult, limit: int = 5) -> list[str]:
    if res.share_identical is None:
        return [
            f"Lossless check: no comparable outputs ({res.unmatched} unmatched, {res.skipped} skipped)"
        ] + [f"  note: {n}" for n in res.notes]
    lines = [
        f"Lossless check: {res.identical}/{res.pairs} outputs identical ({res.share_identical * 100:.1f}%)"
        + (f"; {res.unmatched} unmatched" if res.unmatched else "")
        + (f"; {res.skipped} skipped (failed or empty)" if res.skipped else "")
    ]
    for c, (n, same) in res.by_level.items():
        lines.append(f"  C={c}: {same}/{n} identical")
    for dv in res.divergences[:limit]:
        lines.append(
            f"  C={dv.concurrency} trial {dv.trial} prompt {dv.prompt_id}: "
            f"first divergence at char {dv.char}, "
            f"word {dv.word}: {dv.a_excerpt!r} vs {dv.b_excerpt!r}"
        )
    if len(res.divergences) > limit:
        lines.append(f"  ... and {len(res.divergences) - limit} more divergent outputs")
    lines += [f"  note: {n}" for n in res.notes]
    lines.append(
        "  (greedy outputs can also differ with batch composition, so rare late divergences at high "
        "concurrency are not proof of a speculative bug)"
    )
    return lines


def _diag_to_dict(d: LevelDiagnosis) -> dict[str, Any]:
    return {
        "concurrency": d.concurrency,
        "acceptance": acceptance_to_dict(d.acceptance) if d.acceptance else None,
        "baseline_tok_s": d.baseline_tok_s,
        "spec_tok_s": d.spec_tok_s,
        "speedup": d.speedup,
        "length": d.length,
        "step_cost": d.step_cost,
        "findings": [
            {"check": f.check, "message": f.message, "figures": dict(f.figures)} for f in d.findings
        ],
    }


def _lossless_to_dict(res: LosslessResult) -> dict[str, Any]:
    return {
        "pairs": res.pairs,
        "identical": res.identical,
        "share_identical": res.share_identical,
        "unmatched": res.unmatched,
        "skipped": res.skipped,
        "by_level": {str(c): {"pairs": n, "identical": s} for c, (n, s) in res.by_level.items()},
        "divergences": [dataclasses.asdict(dv) for dv in res.divergences],
        "notes": list(res.notes),
    }


@click.command("spec")
@click.argument("baseline")
@click.argument("spec_run", metavar="SPEC")
@click.option("--db", type=click.Path(dir_okay=False), default=None, help="results store (run ids)")
@click.option(
    "--metric",
    type=click.Choice(SPEEDUP_METRICS),
    default="agg_tok_s",
    show_default=True,
    help="throughput the speedup S is taken of",
)
@click.option(
    "--margin", type=float, default=2.0, show_default=True, help="equivalence margin %% for verdicts"
)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def spec_command(
    baseline: str, spec_run: str, db: str | None, metric: str, margin: float, as_json: bool
) -> None:
    """Speculative accounting of SPEC against BASELINE (result files or run ids): per level L, acceptance,
    per-position acceptance, verify steps/s, speedup S and step cost r = L/S, a diagnosis, and a lossless
    check."""
    base, spec = _load(baseline, db), _load(spec_run, db)
    verdicts = {v.concurrency: v.verdict for v in compare_runs(base, spec, metric, margin)}
    diags = diagnose(
        base,
        spec,
        trial_throughput=_throughput(metric),
        verdicts=verdicts,
        config_diff=resolved_diff(base, spec),
    )
    loss = lossless_check(base, spec)
    if as_json:
        out = {
            "baseline": base.meta.run_id,
            "spec": spec.meta.run_id,
            "metric": metric,
            "levels": [_diag_to_dict(d) for d in diags],
            "lossless": _lossless_to_dict(loss),
        }
        click.echo(json.dumps(out, indent=2, default=str))
        return
    console = _console()
    console.print(accounting_table(diags, metric))
    for line in diagnosis_lines(diags):
        console.print(line, highlight=False, markup=False)
    console.print()
    for line in lossless_lines(loss):
        console.print(line, highlight=False, markup=False)


# ---- tokbench spec-model --------------------------------------------------------------------------


def _parse_accept(text: str) -> tuple[float, ...]:
    try:
        probs = tuple(float(p) for p in text.replace(" ", "").split(",") if p)
    except ValueError:
        raise ConfigError(
            f"--accept: {text!r} is not a comma-separated list of per-position acceptance rates, "
            "e.g. 0.8,0.6,0.4"
        ) from None
    if not probs:
        raise ConfigError("--accept: give at least one per-position acceptance rate, e.g. 0.8,0.6,0.4")
    return probs


def infer_k(accs: Sequence[Acceptance | None]) -> int | None:
    """Draft tokens per drafting step: draft tokens / drafts over all levels, else the per-position count."""
    found = [a for a in accs if a is not None and a.engaged]
    drafts = sum(a.drafts or 0 for a in found if a.draft_tokens is not None)
    draft_tokens = sum(a.draft_tokens or 0 for a in found if a.drafts)
    if drafts and draft_tokens:
        return max(1, round(draft_tokens / drafts))
    positions = max((len(a.per_position) for a in found), default=0)
    return positions or None


def fit_runs(base: RunResult, spec: RunResult, k: int | None, metric: str) -> Fit:
    """Measured (C, L, S) per level of two runs, then the model fit."""
    rows, accs = [], []
    tp = _throughput(metric)
    for lv in spec.levels:
        acc = level_acceptance(lv)
        accs.append(acc)
        b, s = level_throughput(base, lv.concurrency, tp), level_throughput(spec, lv.concurrency, tp)
        if acc is not None and acc.engaged and acc.length and b and s:
            rows.append((lv.concurrency, acc.length, s / b))
    if not rows:
        raise InsufficientDataError(
            "spec-model --fit: no level has both acceptance data in SPEC and throughput in both runs; "
            "run `tokbench spec BASELINE SPEC` to see what is missing"
        )
    k = k or infer_k(accs)
    if k is None:
        raise ConfigError(
            "--k: the runs do not say how many tokens were drafted per step; pass --k, e.g. --k 3"
        )
    return fit(rows, k)


def fit_lines(ft: Fit) -> list[str]:
    knee = f"{ft.knee:.1f}" if ft.knee is not None else "not reached within the measured levels"
    lines = [
        f"implied draft cost c = {ft.c:.3f} plain steps per draft token (k = {ft.k}), knee = {knee}",
        f"model vs measured: rmse of S {ft.rmse:.3f}, worst residual {ft.max_abs_residual_pct:.1f}%",
    ]
    if ft.at_bound:
        lines.append("note: c hit the search bound; the slowdown is beyond what a draft cost explains")
    return lines


def fit_table(ft: Fit) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title="Speedup: measured vs model")
    for name in ("C", "L", "S measured", "S model", "residual", "r model"):
        t.add_column(name, justify="right")
    for lv in ft.levels:
        t.add_row(
            str(lv.concurrency),
            _f(lv.length),
            _f(lv.measured),
            _f(lv.predicted),
            f"{lv.residual_pct:+.1f}%",
            _f(step_cost(ft.k, ft.c, ft.knee, lv.concurrency)),
        )
    return t


@click.command("spec-model")
@click.option("--accept", "accept", default=None, help="per-position acceptance (marginal), e.g. 0.8,0.6,0.4")
@click.option("--alpha", type=float, default=None, help="i.i.d. per-token acceptance α instead of --accept")
@click.option("--k", "k", type=int, default=None, help="draft tokens per step (default: the --accept count)")
@click.option("--c", "--draft-cost", "c", type=float, default=0.0, show_default=True, help="draft token cost")
@click.option("--knee", type=float, default=None, help="concurrency where verification turns compute-bound")
@click.option("-c", "--concurrency", "levels", default="1,4,16,32", show_default=True, help="levels")
@click.option("--fit", "do_fit", is_flag=True, help="fit c and the knee to --baseline and --spec runs")
@click.option("--baseline", default=None, help="--fit: baseline result file or run id")
@click.option("--spec", "spec_arg", default=None, help="--fit: speculative result file or run id")
@click.option("--db", type=click.Path(dir_okay=False), default=None, help="results store (run ids)")
@click.option("--metric", type=click.Choice(SPEEDUP_METRICS), default="agg_tok_s", show_default=True)
def spec_model_command(
    accept: str | None,
    alpha: float | None,
    k: int | None,
    c: float,
    knee: float | None,
    levels: str,
    do_fit: bool,
    baseline: str | None,
    spec_arg: str | None,
    db: str | None,
    metric: str,
) -> None:
    """Predicted speculative speedup per concurrency from the model S(B) = L / r(B),
    r(B) = clamp(B/knee, 1, k+1) + k·c; or, with --fit, the c and knee implied by a measured baseline and
    speculative pair."""
    console = _console()
    if do_fit:
        if not baseline or not spec_arg:
            raise ConfigError("--fit: needs --baseline A and --spec B (result files or run ids)")
        ft = fit_runs(_load(baseline, db), _load(spec_arg, db), k, metric)
        for line in fit_lines(ft):
            console.print(line, highlight=False, markup=False)
        console.print(fit_table(ft))
        return
    if (accept is None) == (alpha is None):
        raise ConfigError("spec-model: give exactly one of --accept 0.8,0.6,0.4 or --alpha 0.7 (or --fit)")
    if alpha is not None:
        if k is None:
            raise ConfigError("--k: --alpha needs the number of draft tokens per step, e.g. --k 3")
        per_pos: Sequence[float] = alpha_positions(alpha, k)
    else:
        per_pos = _parse_accept(accept or "")
        k = k or len(per_pos)
    preds = predict(per_pos, k, c, knee, parse_levels(levels))
    knee_s = f"{knee:g}" if knee is not None else "none"
    console.print(
        f"k = {k}, c = {c:g}, knee = {knee_s}, per-position {','.join(f'{p:.3f}' for p in per_pos[:k])}"
        f" -> L = {preds[0].length:.3f}",
        highlight=False,
        markup=False,
    )
    t = Table(box=box.SIMPLE_HEAD, title="Predicted speedup")
    for name in ("C", "L", "r", "S"):
        t.add_column(name, justify="right")
    for p in preds:
        t.add_row(str(p.concurrency), _f(p.length), _f(p.step_cost), _f(p.speedup))
    console.print(t)


COMMANDS: list[click.Command] = [spec_command, spec_model_command]


def resolved_diff(base: RunResult, spec: RunResult) -> list[tuple[str, Any, Any, bool]] | None:
    """The resolved-configuration diff the campaign computes, from what each run recorded of its server."""
    a, b = base.meta.server, spec.meta.server
    ra, rb = a.get("resolved"), b.get("resolved")
    if not ra or not rb:
        return None
    flags = changed_flags(a.get("argv") or (), b.get("argv") or (), a.get("env"), b.get("env"))
    return [(d.key, json_safe(d.a), json_safe(d.b), d.expected) for d in config_diff(ra, rb, flags)]
