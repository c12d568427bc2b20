"""CLI: `tokbench report RUN...` (self-contained HTML and/or PR-ready markdown) and `tokbench export RUN`
(tokbench JSON, vLLM `bench serve` JSON, CSV). RUN is a result file or a run id (prefix) in the store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import cast

import click
import numpy as np

from tokbench.records import RunResult
from tokbench.store import load_run_arg

_DB_HELP = "results store for run ids [default: the user data directory, or $TOKBENCH_DB]"
_OUT = click.Path(dir_okay=False, path_type=Path)
_REPORT_SEED = 0  # bootstrap draws inside compare: the same runs give the same report


def _names(runs: list[RunResult]) -> list[str]:
    """Labels, falling back to run ids where labels are missing or repeated, numbered if still repeated
    (the same run given twice)."""
    labels = [r.meta.label for r in runs]
    names = [
        r.meta.label if r.meta.label and labels.count(r.meta.label) == 1 else r.meta.run_id for r in runs
    ]
    return [f"{n} #{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


@click.command("report")
@click.argument("runs", nargs=-1, required=True)
@click.option(
    "--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), help="write the HTML here"
)
@click.option(
    "--md", "md_out", type=click.Path(dir_okay=False, path_type=Path), help="write the markdown here"
)
@click.option("--metric", default="agg_tok_s", show_default=True, help="metric the verdicts judge")
@click.option("--margin", type=float, default=2.0, show_default=True, help="equivalence margin in %")
@click.option("--title", default=None, help="title of the HTML page")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None, help=_DB_HELP)
def report(
    runs: tuple[str, ...],
    html_out: Path | None,
    md_out: Path | None,
    metric: str,
    margin: float,
    title: str | None,
    db: Path | None,
) -> None:
    """Report on RUNS; every run after the first is judged against the first (the baseline).

    Without --html or --md the markdown goes to stdout."""
    from tokbench.report.export import write_text_atomic
    from tokbench.report.html import html_report
    from tokbench.report.markdown import markdown_report
    from tokbench.stats.compare import compare_runs

    loaded = [load_run_arg(arg, db) for arg in runs]
    names = _names(loaded)
    # Give every run a distinct label so tables, plots and verdict titles can tell them apart.
    loaded = [replace(r, meta=replace(r.meta, label=name)) for r, name in zip(loaded, names, strict=True)]
    rng = np.random.default_rng(_REPORT_SEED)
    verdicts = {
        f"{names[i]} vs {names[0]}": compare_runs(loaded[0], b, metric=metric, margin_pct=margin, rng=rng)
        for i, b in enumerate(loaded[1:], start=1)
    }
    md = markdown_report(loaded, verdicts)
    if html_out is None and md_out is None:
        click.echo(md, nl=False)
        return
    if md_out is not None:
        write_text_atomic(md_out.expanduser(), md)
        click.echo(f"wrote {md_out}", err=True)
    if html_out is not None:
        write_text_atomic(html_out.expanduser(), html_report(loaded, verdicts, title=title))
        click.echo(f"wrote {html_out}", err=True)


@click.command("export")
@click.argument("run")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "vllm", "csv", "csv-trials"]),
    required=True,
    help="json: tokbench result file; vllm: `vllm bench serve` result JSON, one object per line per level "
    "and trial; csv: one row per request; csv-trials: one row per trial with its figures",
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="file to write")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None, help=_DB_HELP)
def export(run: str, fmt: str, out: Path, db: Path | None) -> None:
    """Write RUN in another format, for dashboards and tools that read vLLM results or CSV."""
    from tokbench.report.export import ExportFormat, export_run

    export_run(load_run_arg(run, db), cast(ExportFormat, fmt), out.expanduser())
    click.echo(f"wrote {out}", err=True)


COMMANDS: list[click.Command] = [report, export]
