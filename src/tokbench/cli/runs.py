"""CLI: `tokbench runs ls|show|import`: find stored runs again, look at one, store result files."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from tokbench.store import Store, default_db_path, parse_since, read_result_file

_DB_HELP = "results store [default: the user data directory, or $TOKBENCH_DB]"


def _open(db: Path | None, *, must_exist: bool = True) -> Store:
    path = db.expanduser() if db is not None else default_db_path()
    if must_exist and not path.is_file():
        from tokbench.errors import StoreError

        raise StoreError(f"no results store at {path}; run `tokbench sweep` first, or pass --db PATH")
    return Store(path)


def _console() -> Console:
    # Off a terminal (pipes, CI logs) keep rows whole instead of wrapping to 80 columns.
    return Console(soft_wrap=False, width=None if Console().is_terminal else 200)


@click.group("runs")
def runs() -> None:
    """Runs in the results store."""


@runs.command("ls")
@click.option("--label", default=None, help="only runs with this label")
@click.option("--since", default=None, help="only runs started at or after this date, e.g. 2026-11-01")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None, help=_DB_HELP)
def ls(label: str | None, since: str | None, db: Path | None) -> None:
    """List stored runs, newest first."""
    cutoff = parse_since(since) if since is not None else None
    path = db.expanduser() if db is not None else default_db_path()
    if not path.is_file():
        click.echo(f"no runs stored yet (no results store at {path})")
        return
    with _open(path) as store:
        metas = store.list_runs(label=label, since=cutoff)
        counts = store.counts()
    table = Table(box=None, header_style="bold")
    for name in ("ID", "Label", "Started", "Status", "Levels", "Trials", "Requests", "Model", "Engine"):
        table.add_column(
            name, no_wrap=True, justify="right" if name in ("Levels", "Trials", "Requests") else "left"
        )
    for m in metas:
        n = counts.get(m.run_id)
        engine = m.server.get("engine", "") if isinstance(m.server, dict) else ""
        table.add_row(
            m.run_id,
            m.label,
            m.started_at,
            "complete" if m.complete else "[yellow]incomplete[/]",
            str(n.levels) if n else "0",
            str(n.trials) if n else "0",
            (f"{n.ok}/{n.requests}" if n.ok != n.requests else str(n.requests)) if n else "0",
            m.model,
            str(engine),
        )
    out = _console()
    if metas:
        out.print(table)
    else:
        out.print("no runs" + (" match" if label or since else " stored yet"))


@runs.command("show")
@click.argument("run_id")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None, help=_DB_HELP)
def show(run_id: str, db: Path | None) -> None:
    """One run: its metadata and the seed's table (a unique prefix of the id is enough)."""
    from tokbench.report.terminal import seed_table

    with _open(db) as store:
        run = store.load_run(run_id)
        verdicts = [v for v in store.verdicts() if run.meta.run_id in (v["run_a"], v["run_b"])]
    m = run.meta
    out = _console()
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for key, value in (
        ("run", m.run_id),
        ("label", m.label),
        ("status", "complete" if m.complete else "incomplete (interrupted; figures cover finished requests)"),
        ("started", m.started_at),
        ("server", m.base_url),
        ("api / model", f"{m.api} / {m.model}"),
        ("engine", str(m.server.get("engine", "")) if m.server else ""),
        ("tokbench", m.tool_version),
        ("source", m.source),
    ):
        if value:
            facts.add_row(key, value)
    out.print(facts)
    out.print(seed_table(run))
    for v in verdicts:
        out.print(
            f"C={v['concurrency']} {v['metric']}: {v['verdict']} "
            f"(B {v['run_b']} vs A {v['run_a']}, compared {v['created_at']})",
            markup=False,
        )


@runs.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None, help=_DB_HELP)
def import_(files: tuple[Path, ...], db: Path | None) -> None:
    """Store runs from JSON result files (as `sweep --out` writes them)."""
    loaded = [read_result_file(f.expanduser()) for f in files]  # all readable before any is stored
    with _open(db, must_exist=False) as store:
        for path, run in zip(files, loaded, strict=True):
            click.echo(f"{path}: stored as run {store.save_run(run)}")


COMMANDS: list[click.Command] = [runs]
