"""The HTML report: one self-contained file (inline SVG plots, inline CSS, no script, nothing fetched) that
opens offline in any browser.

Tables come from the same row builders as the markdown report; plots from report.plots.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jinja2
from markupsafe import Markup

from tokbench import __version__
from tokbench.records import RunResult
from tokbench.report import plots
from tokbench.report.markdown import (
    SEED_HEADER,
    SPEC_HEADER,
    VERDICT_HEADER,
    SpecInput,
    VerdictInput,
    diff_configs,
    flatten,
    run_name,
    seed_cells,
    seed_rows,
    show_value,
    spec_cells,
    spec_rows,
    split_title,
    verdict_caption,
    verdict_cells,
)

_ENV_VALUE_MAX = 120


def _environment(runs: Sequence[RunResult]) -> list[tuple[str, list[str], bool]]:
    """Every environment key (plus the run's own facts) with each run's value, and whether they differ."""
    flat = []
    for r in runs:
        m = r.meta
        facts = {
            "run_id": m.run_id,
            "tokbench": m.tool_version,
            "started_at": m.started_at,
            "base_url": m.base_url,
            "api": m.api,
            "model": m.model,
            "source": m.source,
        }
        flat.append({**facts, **flatten(m.environment)})
    keys = list(dict.fromkeys(k for f in flat for k in f))
    rows = []
    for key in keys:
        values = [f.get(key) for f in flat]
        differs = len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1
        rows.append((key, [show_value(v, _ENV_VALUE_MAX) for v in values], differs and key != "run_id"))
    return rows


def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tokbench.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("report.html.j2")


def html_report(
    runs: Sequence[RunResult],
    verdicts: VerdictInput | None = None,
    spec: SpecInput | None = None,
    config_diff: Sequence[tuple[str, Sequence[str]]] | None = None,
    title: str | None = None,
) -> str:
    """The report as one HTML document. Arguments as for `markdown_report`."""
    names = [run_name(r) for r in runs]
    accounting = spec_rows(runs, spec)

    def svg(text: str | None) -> Markup | None:
        # Our own matplotlib output, not user text: the only markup let through unescaped.
        return Markup(text) if text is not None else None

    svgs = {
        "throughput": svg(plots.throughput_svg(runs)),
        "tradeoff": svg(plots.tradeoff_svg(runs)),
        "latency": svg(plots.latency_svg(runs)),
        "acceptance": svg(
            plots.acceptance_svg(
                {label: {r.concurrency: r.per_position for r in rows} for label, rows in accounting.items()}
            )
        ),
    }
    groups = []
    for group_title, vs in (verdicts or {}).items():
        a, b = split_title(group_title, runs)
        groups.append(
            {
                "a": a,
                "b": b,
                "caption": verdict_caption(vs, a, b),
                "rows": [{"cells": verdict_cells(v), "verdict": v.verdict} for v in vs],
            }
        )
    run_views = []
    for r in runs:
        m = r.meta
        facts = " · ".join(x for x in (f"run {m.run_id}", m.model, m.started_at, m.api, m.base_url) if x)
        run_views.append(
            {
                "name": run_name(r),
                "complete": m.complete,
                "facts": facts,
                "rows": [seed_cells(row) for row in seed_rows(r)],
            }
        )
    return _template().render(
        version=__version__,
        title=title or "tokbench report: " + " vs ".join(names),
        subtitle=f"{len(runs)} run(s): " + ", ".join(names),
        runs=run_views,
        run_names=names,
        multi_trial=any(len(lv.trials) > 1 for r in runs for lv in r.levels),
        seed_header=SEED_HEADER,
        verdict_header=VERDICT_HEADER,
        spec_header=SPEC_HEADER,
        plots=svgs,
        verdicts=groups,
        spec={label: [spec_cells(row) for row in rows] for label, rows in accounting.items()},
        diff=diff_configs(runs) if config_diff is None else config_diff,
        environment=_environment(runs),
    )
