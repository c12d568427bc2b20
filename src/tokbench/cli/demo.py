"""CLI: `tokbench demo` measures a real engine end to end: llama.cpp's llama-server with Gemma 3 270M, plain
versus n-gram and draft-model speculative decoding, through the campaign machinery, with verdicts and why.

The engine is built and cached on first use (`tokbench engines install llamacpp`); after that the demo takes a
few minutes on two cores.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click
import platformdirs
from rich.console import Console

from tokbench.config import Plan, parse_levels, plan_from_dict
from tokbench.errors import ServerError
from tokbench.server.install import EnginePaths

if TYPE_CHECKING:
    from tokbench.campaign import CampaignResult

# Four slots by default: requests at C <= 4 are batched together instead of queueing. The context is
# split over the slots; 8192 leaves each prompt plus a few hundred output tokens ample room and keeps the
# KV cache small.
_CONTEXT = "8192"
DEMO_CONFIGS = (
    ("baseline", ()),
    # Drafts from n-grams already in the context: free to propose, and a small model's output repeats.
    ("ngram", ("--spec-type", "ngram-simple")),
    # The model drafting for itself: every draft accepted, yet each step pays for a second full model.
    ("draft-same-model", ("-md", "{model}", "--spec-type", "draft-simple")),
)


def llama_server_argv(engine: EnginePaths, *extra: str, parallel: int = 4) -> tuple[str, ...]:
    """llama-server on {host}:{port} (the campaign fills both), `parallel` slots, Prometheus metrics."""
    fill = {"{model}": str(engine.model)}
    return (
        str(engine.server),
        "-m",
        str(engine.model),
        "--host",
        "{host}",
        "--port",
        "{port}",
        "-np",
        str(parallel),
        "-c",
        _CONTEXT,
        "--metrics",
        *(fill.get(a, a) for a in extra),
    )


def demo_plan(
    engine: EnginePaths,
    levels: tuple[int, ...] = (1, 2, 4),
    trials: int = 3,
    max_tokens: int = 128,
    out_dir: Path | None = None,
) -> Plan:
    """Baseline, n-gram and same-model-draft configurations, interleaved round by round. 128 output tokens
    give n-gram drafts enough repetition to matter and keep the demo to a few minutes on two cores."""
    configs = [
        {
            "name": name,
            "engine": "llamacpp",
            "argv": list(llama_server_argv(engine, *extra)),
            "baseline": name == "baseline",
            "ready_timeout_s": 120,
        }
        for name, extra in DEMO_CONFIGS
    ]
    return plan_from_dict(
        {
            "name": "demo",
            "configs": configs,
            "sweep": {
                "concurrencies": list(levels),
                "max_tokens": max_tokens,
                "warmup": 1,
                "timeout_s": 300.0,
                "stall_timeout_s": 60.0,
                "label": "demo",
            },
            "trials": trials,
            "design": "interleaved",
            "out_dir": str(out_dir) if out_dir else None,
        },
        "demo",
    )


def default_out_dir(now: datetime | None = None) -> Path:
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path(platformdirs.user_data_dir("tokbench")) / "demo" / stamp


@click.command("demo")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="output directory [default: <user data dir>/tokbench/demo/<timestamp>]",
)
@click.option("-c", "--concurrency", "levels", default="1,2,4", show_default=True, help="concurrency levels")
@click.option("--trials", type=click.IntRange(2, 20), default=3, show_default=True, help="trials per level")
@click.option(
    "--max-tokens",
    type=click.IntRange(16, 4096),
    default=128,
    show_default=True,
    help="output tokens per request",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="results store [default: the user data directory, or $TOKBENCH_DB]",
)
@click.option("--no-store", is_flag=True, help="do not write the results store")
def demo(
    out: Path | None, levels: str, trials: int, max_tokens: int, db: Path | None, no_store: bool
) -> None:
    """Build llama-server once, then measure plain vs speculative decoding on Gemma 3 270M and explain it."""
    from tokbench.campaign import run_campaign
    from tokbench.cli.engines import install_with_display

    t0 = time.monotonic()
    out_dir = (out or default_out_dir()).expanduser()
    err = Console(stderr=True, soft_wrap=True)
    stdout = Console(soft_wrap=False, width=None if Console().is_terminal else 160)
    engine = install_with_display(err)
    plan = demo_plan(engine, parse_levels(levels), trials, max_tokens, out_dir)
    err.print(
        f"tokbench demo: llama-server {engine.version} + Gemma 3 270M (Q4_K_M) on 127.0.0.1; configurations "
        f"{', '.join(c.name for c in plan.configs)}; C={levels}, {trials} interleaved trials, "
        f"{max_tokens} output tokens per request",
        markup=False,
        highlight=False,
    )
    store = None
    if not no_store:
        from tokbench.store import Store, default_db_path

        store = Store(db.expanduser() if db else default_db_path())
    try:
        result = run_campaign(plan, out_dir, store=store, console=err)
    finally:
        if store is not None:
            store.close()
    _print_results(stdout, plan, result)
    html, md = _write_reports(plan, result, out_dir)
    stdout.print(
        f"\nreport: {html}\n        {md}\nall outputs: {out_dir}/",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    stdout.print(
        f"demo finished in {time.monotonic() - t0:.0f} s", markup=False, highlight=False, soft_wrap=True
    )
    if result.interrupted:
        raise SystemExit(130)
    if result.failures:
        names = ", ".join(result.failures)
        raise ServerError(f"the demo could not measure {names}; see the triage above and {out_dir}/logs/")


def _print_results(stdout: Console, plan: Plan, result: CampaignResult) -> None:
    from tokbench.cli.spec import accounting_table, diagnosis_lines
    from tokbench.report.terminal import seed_table, verdict_notes, verdict_table

    base = plan.baseline.name
    for name, run in result.runs.items():
        stdout.print(f"\n[bold]{name}[/bold]  ({' '.join(_flags(plan, name)) or 'plain decoding'})")
        stdout.print(seed_table(run))
    for o in result.outcomes:
        if o.baseline or o.verdicts is None:
            continue
        stdout.print(verdict_table(o.verdicts, base, o.name))
        for line in verdict_notes(o.verdicts):
            stdout.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
        if o.spec_levels:
            stdout.print(accounting_table(o.spec_levels, plan.metric))
            for line in diagnosis_lines(o.spec_levels):
                stdout.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
        elif o.spec_error:
            stdout.print(
                f"  speculative accounting failed: {o.spec_error}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
    stdout.print("\n" + result.checklist, markup=False, highlight=False, soft_wrap=True)


def _flags(plan: Plan, name: str) -> tuple[str, ...]:
    extra = dict(DEMO_CONFIGS).get(name, ())
    return tuple("<same model>" if a == "{model}" else a for a in extra)


def _write_reports(plan: Plan, result: CampaignResult, out_dir: Path) -> tuple[Path, Path]:
    from tokbench.report.export import write_text_atomic
    from tokbench.report.html import html_report
    from tokbench.report.markdown import markdown_report

    runs = list(result.runs.values())
    base = plan.baseline.name
    verdicts = {f"{name} vs {base}": vs for name, vs in result.verdicts.items()}
    html = out_dir / "report.html"
    md = out_dir / "report.md"
    write_text_atomic(html, html_report(runs, verdicts, title="tokbench demo: llama-server + Gemma 3 270M"))
    write_text_atomic(md, markdown_report(runs, verdicts))
    return html, md


COMMANDS: list[click.Command] = [demo]
