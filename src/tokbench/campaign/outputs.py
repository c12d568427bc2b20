"""What a campaign leaves behind, computed from the recorded runs after measuring: the comparison of each
configuration with the baseline (comparison.json, comparison.md) and checklist.md, one line per configuration.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokbench.campaign.run import Failure
from tokbench.campaign.schedule import CLOSING_SUFFIX
from tokbench.config import Plan, ServerSpec
from tokbench.records import RunResult
from tokbench.report.export import jsonable, write_text_atomic
from tokbench.report.markdown import VERDICT_HEADER, md_table, verdict_caption, verdict_cells
from tokbench.server.engines import ConfigDifference, json_safe
from tokbench.stats.compare import LevelVerdict, verdict_to_dict

# A speculative-decoding configuration, by its flags (SGLang, vLLM, llama.cpp): the spec hook's accounting is
# only worth a line in the checklist for these, or when the run recorded acceptance.
SPECULATIVE_FLAG = re.compile(r"specul|--spec-|^-md$|--model-draft|draft|eagle|nextn|mtp|ngram", re.I)

SpecDiagnose = Callable[..., Sequence[Any]]


@dataclass
class Outcome:
    """One configuration's (or the closing baseline run's) results, ready to be written."""

    name: str
    spec: ServerSpec
    baseline: bool
    run: RunResult | None
    expected_cells: tuple[tuple[int, int], ...]
    failures: list[Failure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # preflight warnings
    verdicts: list[LevelVerdict] | None = None
    diff: list[ConfigDifference] = field(default_factory=list)
    diff_note: str | None = None  # why the resolved configurations were not diffed
    spec_levels: Sequence[Any] | None = None
    spec_error: str | None = None

    @property
    def missing(self) -> list[tuple[int, int]]:
        have = {(lv.concurrency, t.trial) for lv in self.run.levels for t in lv.trials} if self.run else set()
        return [c for c in self.expected_cells if c not in have]


# ---- wording ---------------------------------------------------------------------------------------------


def levels_text(levels: Sequence[int], span: bool = False) -> str:
    """(1, 4, 16, 32) -> 'C=1..32' as a span, else 'C=1,4,16,32'."""
    ordered = sorted(set(levels))
    if span and len(ordered) >= 3:
        return f"C={ordered[0]}..{ordered[-1]}"
    return "C=" + ",".join(str(c) for c in ordered)


def _num(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def level_detail(v: LevelVerdict) -> str:
    """'C=1 +0.1% [-1.2, +1.4]'."""
    if not _num(v.delta_pct):
        return f"C={v.concurrency} n/a"
    assert v.delta_pct is not None
    text = f"C={v.concurrency} {v.delta_pct:+.1f}%"
    if _num(v.ci_low_pct) and _num(v.ci_high_pct):
        assert v.ci_low_pct is not None and v.ci_high_pct is not None
        text += f" [{v.ci_low_pct:+.1f}, {v.ci_high_pct:+.1f}]"
    return text


_GROUPS = (
    (("faster", "better"), "faster at {c}"),
    (("slower", "worse"), "slower at {c}"),
    (("no_difference",), "no detectable difference at {c}"),
    (("inconclusive",), "inconclusive at {c}"),
    (("insufficient_data",), "insufficient data at {c} (needs 2+ trials per level and side)"),
)


def verdict_phrase(verdicts: Sequence[LevelVerdict], *, benefit: str = "benefit") -> str:
    """'no detectable benefit at C=1..32 (C=1 +0.1% [-1.2, +1.4]; ...)' or 'faster at C=16,32, no detectable
    difference at C=1,4 (...)'."""
    if not verdicts:
        return "no levels to compare"
    details = "; ".join(level_detail(v) for v in verdicts)
    if all(v.verdict == "no_difference" for v in verdicts):
        where = levels_text([v.concurrency for v in verdicts], span=True)
        return f"no detectable {benefit} at {where} ({details})"
    parts = []
    for words, template in _GROUPS:
        group = [v for v in verdicts if v.verdict in words]
        if not group:
            continue
        part = template.format(c=levels_text([v.concurrency for v in group]))
        if words == ("inconclusive",):
            needed = [v.trials_needed for v in group if v.trials_needed]
            part += f" (~{max(needed)} trials per side would decide)" if needed else ""
        parts.append(part)
    return f"{', '.join(parts)} ({details})"


def _cells_text(cells: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"C={c} trial {t + 1}" for c, t in cells)


def _failure_text(f: Failure) -> str:
    if f.kind == "start":
        what = "never became ready" if f.timed_out else "crashed at start"
        return f"{what}: {f.summary} (see {f.log})"
    where = f" at C={f.cell[0]} trial {f.cell[1] + 1}" if f.cell else " between cells"
    after = "; restarted, and that cell was re-run" if f.recovered and f.cell else ""
    if f.recovered and not f.cell:
        after = "; restarted"
    return f"server died{where}: {f.summary} (see {f.log}){after}"


def spec_summary(levels: Sequence[Any]) -> str | None:
    """The speculative diagnosis in one sentence: each problem with the levels it appears at, the first
    level's message as the explanation."""
    by_check: dict[str, list[Any]] = {}
    for lv in levels:
        head = getattr(lv, "headline", None)
        if head is not None:
            by_check.setdefault(head.check, []).append((lv.concurrency, head.message))
    if not by_check:
        return None
    parts = [f"{levels_text([c for c, _ in items])}: {items[0][1]}" for items in by_check.values()]
    return "; ".join(parts)


def _speculative(o: Outcome) -> bool:
    if any(SPECULATIVE_FLAG.search(a) for a in o.spec.argv) or any("SPEC" in k for k in o.spec.env):
        return True
    return any(getattr(lv, "acceptance", None) is not None for lv in (o.spec_levels or ()))


def checklist_line(o: Outcome, baseline: str) -> str:
    """One line: the configuration and its verdict against the baseline, with what went wrong on the way."""
    starts = [f for f in o.failures if f.kind == "start"]
    crashes = [f for f in o.failures if f.kind == "crash"]
    if o.run is None or not any(lv.trials for lv in o.run.levels):
        reason = _failure_text(starts[-1]) if starts else "no results"
        if crashes and not starts:
            reason = _failure_text(crashes[-1])
        return f"- {o.name}: {reason}"
    if o.baseline:
        levels = [lv.concurrency for lv in o.run.levels]
        trials = max(len(lv.trials) for lv in o.run.levels)
        where = levels_text(levels, span=True)
        text = f"- {o.name}: baseline ({o.spec.engine}; {where}, {trials} trials per level)"
    elif o.verdicts is None:
        text = f"- {o.name}: measured, not compared: the baseline '{baseline}' has no results"
    else:
        text = f"- {o.name}: tested, {verdict_phrase(o.verdicts)}"
    extras = [_failure_text(f) for f in o.failures]  # crashes while measured, failed relaunches
    if o.missing:
        extras.append(f"incomplete, not measured: {_cells_text(o.missing)}")
    if o.diff_note:
        extras.append(f"resolved configuration not compared with the baseline's: {o.diff_note}")
    unexpected = [d for d in o.diff if not d.expected]
    if unexpected:
        shown = "; ".join(str(d) for d in unexpected[:6])
        more = f" (+{len(unexpected) - 6} more)" if len(unexpected) > 6 else ""
        extras.append(f"resolved configuration differs beyond the changed flags: {shown}{more}")
    if o.spec_levels and _speculative(o):
        summary = spec_summary(o.spec_levels)
        if summary:
            extras.append(f"speculation: {summary}")
    if o.spec_error:
        extras.append(f"speculative accounting failed: {o.spec_error}")
    extras += [f"preflight warning: {w}" for w in o.warnings]
    return text + "".join(f"\n  - {e}" for e in extras)


def checklist(
    plan: Plan, outcomes: Sequence[Outcome], drift: Sequence[LevelVerdict] | None, interrupted: bool
) -> str:
    base = plan.baseline.name
    title = f"# Campaign checklist{': ' + plan.name if plan.name else ''}"
    lines = [
        title,
        "",
        f"Baseline `{base}`; metric {plan.metric}, equivalence margin ±{plan.margin_pct:g}%, "
        f"design {plan.design}, {plan.rounds} trial(s) per level.",
        "",
    ]
    if interrupted:
        lines += ["**Interrupted**: the campaign stopped early; figures cover what was measured.", ""]
    closing = base + CLOSING_SUFFIX
    lines += [checklist_line(o, base) for o in outcomes if o.name != closing]
    if drift is not None:
        phrase = verdict_phrase(drift, benefit="drift") if drift else "not measured"
        lines.append(f"- drift: the baseline re-run at the end vs its first run: {phrase}")
    return "\n".join(lines) + "\n"


# ---- comparison files ------------------------------------------------------------------------------------


def _diff_json(diff: Sequence[ConfigDifference]) -> list[dict[str, Any]]:
    return [{"key": d.key, "a": json_safe(d.a), "b": json_safe(d.b), "expected": d.expected} for d in diff]


def _spec_json(levels: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    if levels is None:
        return None
    return [jsonable(lv) for lv in levels]


def _failure_json(f: Failure) -> dict[str, Any]:
    return {
        "config": f.config,
        "kind": f.kind,
        "summary": f.summary,
        "log": f.log,
        "cell": list(f.cell) if f.cell else None,
        "recovered": f.recovered,
        "timed_out": f.timed_out,
        "exit": f.triage.exit_description if f.triage else None,
        "tail": list(f.triage.tail) if f.triage else [],
    }


def comparison_json(
    plan: Plan, outcomes: Sequence[Outcome], drift: Sequence[LevelVerdict] | None
) -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for o in outcomes:
        configs[o.name] = {
            "baseline": o.baseline,
            "run_id": o.run.meta.run_id if o.run else None,
            "verdicts": [verdict_to_dict(v) for v in o.verdicts] if o.verdicts is not None else None,
            "config_diff": _diff_json(o.diff),
            "config_diff_note": o.diff_note,
            "spec": _spec_json(o.spec_levels),
            "failures": [_failure_json(f) for f in o.failures],
            "missing_cells": [list(c) for c in o.missing],
            "preflight_warnings": o.warnings,
        }
    return {
        "baseline": plan.baseline.name,
        "metric": plan.metric,
        "margin_pct": plan.margin_pct,
        "design": plan.design,
        "trials": plan.rounds,
        "configs": configs,
        "drift": [verdict_to_dict(v) for v in drift] if drift is not None else None,
    }


def comparison_md(plan: Plan, outcomes: Sequence[Outcome], drift: Sequence[LevelVerdict] | None) -> str:
    base = plan.baseline.name
    out = [f"# Each configuration vs the baseline `{base}`{' (' + plan.name + ')' if plan.name else ''}", ""]
    for o in outcomes:
        if o.baseline:
            continue
        out += [f"## {o.name} vs {base}", ""]
        if o.verdicts:
            out += [
                verdict_caption(o.verdicts, base, o.name),
                "",
                md_table(VERDICT_HEADER, [verdict_cells(v) for v in o.verdicts], right=5),
                "",
            ]
        else:
            why = "no results" if o.run is None else f"the baseline `{base}` has no results"
            out += [f"Not compared: {why}.", ""]
        for f in o.failures:
            out.append(f"- {_failure_text(f)}")
        if o.failures:
            out.append("")
        if o.diff:
            rows = [
                [
                    d.key,
                    _cell(d.a),
                    _cell(d.b),
                    "changed flag" if d.expected else "**not explained by the flags**",
                ]
                for d in o.diff
            ]
            out += ["Resolved configuration, baseline vs this one:", ""]
            out += [md_table(("Setting", base, o.name, ""), rows, right=0), ""]
        if o.spec_levels and _speculative(o):
            summary = spec_summary(o.spec_levels)
            if summary:
                out += [f"Speculative decoding: {summary}", ""]
    if drift is not None:
        out += [f"## Drift: `{base}` re-run at the end vs its first run", ""]
        if drift:
            out += [md_table(VERDICT_HEADER, [verdict_cells(v) for v in drift], right=5), ""]
    return "\n".join(out).rstrip() + "\n"


def _cell(v: Any) -> str:
    v = json_safe(v)
    text = v if isinstance(v, str) else json.dumps(v)
    return text if len(text) <= 80 else text[:77] + "..."


def write_outputs(
    out_dir: Path, plan: Plan, outcomes: Sequence[Outcome], drift: Sequence[LevelVerdict] | None, text: str
) -> None:
    write_text_atomic(out_dir / "checklist.md", text)
    write_text_atomic(
        out_dir / "comparison.json",
        json.dumps(jsonable(comparison_json(plan, outcomes, drift)), indent=1, default=str) + "\n",
    )
    write_text_atomic(out_dir / "comparison.md", comparison_md(plan, outcomes, drift))


def load_environment_json(env: Mapping[str, Any]) -> str:
    return json.dumps(jsonable(env), indent=1, default=str) + "\n"
