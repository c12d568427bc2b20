"""CLI: `tokbench campaign run PLAN` launches every configuration of a plan, measures, compares with the
baseline and writes results, comparison and checklist; `tokbench campaign check PLAN` validates and preflights
the plan without starting anything.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click
from rich.console import Console

from tokbench.config import Plan, load_plan

EXIT_INTERRUPTED = 130


@click.group("campaign")
def campaign() -> None:
    """Launch server configurations in turn, measure each, and compare them with the baseline."""


@campaign.command("check")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
def check(plan_path: Path) -> None:
    """Validate PLAN and run the preflight rules; nothing is launched."""
    from tokbench.campaign import check_plan, describe, schedule

    plan = load_plan(plan_path)
    warnings = check_plan(plan)
    out = Console(soft_wrap=True)
    launches = schedule(plan)
    out.print(
        f"plan {plan_path}: {len(plan.configs)} configuration(s), baseline {plan.baseline.name!r}, "
        f"design {plan.design}, {plan.rounds} trial(s) per level, {len(launches)} launch(es); preflight "
        f"passed",
        markup=False,
        highlight=False,
    )
    for line in describe(launches):
        out.print(line, markup=False, highlight=False)
    for w in warnings:
        out.print(f"warning: {w}", markup=False, highlight=False)


def _out_dir(plan: Plan, plan_path: Path, out: Path | None) -> Path:
    if out is not None:
        return out.expanduser()
    if plan.out_dir:
        return Path(plan.out_dir).expanduser()
    return Path(f"campaign-{plan_path.stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")


@campaign.command("run")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="output directory [default: the plan's out_dir, else ./campaign-PLAN-TIMESTAMP]",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="results store [default: the user data directory, or $TOKBENCH_DB]",
)
@click.option("--no-store", is_flag=True, help="do not write the results store")
def run(plan_path: Path, out: Path | None, db: Path | None, no_store: bool) -> None:
    """Run every configuration of PLAN and write results/, logs/, comparison.md and checklist.md."""
    from tokbench.campaign import run_campaign
    from tokbench.report.terminal import verdict_table

    plan = load_plan(plan_path)
    out_dir = _out_dir(plan, plan_path, out)
    err = Console(stderr=True)
    # not a terminal (a pipe, CI logs): wide enough that the verdict table is not squeezed
    stdout = Console(soft_wrap=False, width=None if Console().is_terminal else 200)
    store = None
    if not no_store:
        from tokbench.store import Store, default_db_path

        store = Store(db.expanduser() if db else default_db_path())
    try:
        result = run_campaign(plan, out_dir, store=store, console=err)
    finally:
        if store is not None:
            store.close()
    base = plan.baseline.name
    for name, verdicts in result.verdicts.items():
        stdout.print(verdict_table(verdicts, base, name))
    stdout.print(result.checklist, markup=False, highlight=False)
    err.print(f"wrote {out_dir}/ (checklist.md, comparison.md, comparison.json, results/, logs/)")
    if result.interrupted:
        err.print("interrupted: the servers were stopped; what was measured is in the output directory")
        raise SystemExit(EXIT_INTERRUPTED)


COMMANDS: list[click.Command] = [campaign]
