"""CLI: `tokbench compare A B` (per-level verdicts), `tokbench calibrate` (A/A noise floor and power) and
`tokbench import FILE` (summary tables from other tools as a result file compare accepts)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console

from tokbench.cli.sweep import load_options, measure
from tokbench.errors import ConfigError
from tokbench.records import RunResult
from tokbench.report.terminal import calibration_table, seed_table, verdict_notes, verdict_table
from tokbench.stats.compare import compare_runs, run_warnings, verdict_to_dict
from tokbench.stats.importer import import_summary
from tokbench.stats.power import calibrate
from tokbench.stats.summary import METRICS

_METRIC = click.Choice(list(METRICS))
_METRIC_HELP = (
    "agg_tok_s, steady_agg_tok_s, per_req_tok_s (higher is better) or {ttft,itl,tpot,e2e,queue}_{p50,p90,p99,"
    "mean} (lower is better)"
)


def _console() -> Console:
    # Piped or redirected output has no terminal width; 80 columns would wrap the tables.
    return Console() if sys.stdout.isatty() else Console(width=120)


def _load(arg: str, db: str | None) -> RunResult:
    from tokbench.store import load_run_arg

    return load_run_arg(arg, db)


def _label(run: RunResult, arg: str) -> str:
    return run.meta.label or Path(arg).stem or run.meta.run_id


def _record_verdicts(a_arg: str, b_arg: str, a: RunResult, b: RunResult, metric: str,
                     verdicts: list[dict[str, Any]], db: str | None) -> None:  # fmt: skip
    """Both runs came from the store: keep the verdict beside them (files stay files)."""
    if Path(a_arg).expanduser().is_file() or Path(b_arg).expanduser().is_file():
        return
    from tokbench.store import Store, default_db_path

    with Store(Path(db).expanduser() if db else default_db_path()) as store:
        store.add_verdicts(a.meta.run_id, b.meta.run_id, metric, verdicts)


@click.command("compare")
@click.argument("a")
@click.argument("b")
@click.option(
    "--metric",
    type=_METRIC,
    metavar="METRIC",
    default="agg_tok_s",
    show_default=True,
    help=_METRIC_HELP,
)
@click.option(
    "--margin",
    type=float,
    default=2.0,
    show_default=True,
    help="equivalence margin in %: an interval inside ±margin means no_difference",
)
@click.option("--json", "as_json", is_flag=True, help="print the verdicts as a JSON list")
@click.option("--db", type=click.Path(dir_okay=False), default=None, help="results store (for run ids)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the paired-delta bootstrap")
def compare(a: str, b: str, metric: str, margin: float, as_json: bool, db: str | None, seed: int) -> None:
    """Is B faster than A at each concurrency level, beyond noise? A and B are result files or run ids.

    Per level: B's change vs A in % with a 95% interval over trials, and a verdict: faster / slower (B
    better / worse on the metric), no_difference (interval inside ±margin), inconclusive (with the trials
    per side that would settle it) or insufficient_data (fewer than 2 trials a side)."""  # fmt: skip
    run_a, run_b = _load(a, db), _load(b, db)
    verdicts = compare_runs(run_a, run_b, metric, margin, rng=np.random.default_rng(seed))
    dicts = [verdict_to_dict(v) for v in verdicts]
    _record_verdicts(a, b, run_a, run_b, metric, dicts, db)
    if as_json:
        click.echo(json.dumps(dicts, indent=2))
        for line in run_warnings(run_a, run_b):  # stdout stays one JSON document
            click.echo(line, err=True)
        return
    console = _console()
    console.print(verdict_table(verdicts, _label(run_a, a), _label(run_b, b)))
    for line in run_warnings(run_a, run_b) + verdict_notes(verdicts):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


# ---- import ------------------------------------------------------------------------------------------------


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="result file to write [default: FILE with suffix .result.json]",
)
@click.option("--label", default=None, help="label of the imported run [default: the file's name]")
def import_cmd(file: Path, out: Path | None, label: str | None) -> None:
    """Turn summary tables (C | Agg tok/s | Per-req tok/s | Tokens | Wall(s) | Ok, markdown or CSV) into a
    result file. Several tables in FILE are several trials."""  # fmt: skip
    from tokbench.report.export import write_result_json

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: cannot read ({e})") from None
    mtime = datetime.fromtimestamp(file.stat().st_mtime, tz=timezone.utc).isoformat(timespec="seconds")
    run = import_summary(text, source=file.name, label=label or file.stem, started_at=mtime)
    target = out or file.with_suffix(".result.json")
    if target.resolve() == file.resolve():
        raise ConfigError(f"--out: {target} is the input file; choose another path")
    write_result_json(run, target)
    trials = max(len(lv.trials) for lv in run.levels)
    console = _console()
    console.print(seed_table(run))
    console.print(f"wrote {target} ({trials} trial(s) per level; compare needs 2+ a side)", markup=False)


# ---- calibrate ---------------------------------------------------------------------------------------------


@click.command("calibrate")
@click.option("--base-url", default=None, help="server to measure (an A/A run: K trials, nothing changed)")
@click.option("--from", "from_run", default=None, help="calibrate from an existing A/A result file or run id")
@click.option("--trials", type=int, default=5, show_default=True, help="trials per level (3 or more)")
@click.option("--label", default="calibration", show_default=True, help="a name for the A/A run")
@click.option(
    "--detect", type=float, default=None, help="a change in % to find the trials per side for, e.g. 3"
)
@click.option(
    "--margin",
    type=float,
    default=2.0,
    show_default=True,
    help="the equivalence margin in % you will compare with: changes inside it are no_difference",
)
@click.option(
    "--metric", type=_METRIC, metavar="METRIC", default="agg_tok_s", show_default=True, help=_METRIC_HELP
)
@load_options
def calibrate_cmd(**kw: Any) -> None:  # fmt: skip
    """Noise floor per level from an A/A run against one unchanged server, the smallest change K trials per
    side can detect (80% power, alpha 0.05, compare's rule with --margin), and with --detect the trials per
    side a given change needs. The load options are sweep's: measure the workload your A/B will run."""
    from_run: str | None = kw["from_run"]
    margin: float = kw["margin"]
    detect: float | None = kw["detect"]
    if (kw["base_url"] is None) == (from_run is None):
        raise ConfigError("calibrate: give either --base-url (measure now) or --from (an earlier A/A run)")
    if not 0 <= margin < 100:
        raise ConfigError(f"--margin: {margin} is not a margin in % between 0 and 100, e.g. 2")
    if detect is not None and not 0 < detect < 100:
        raise ConfigError(f"--detect: {detect} is not a change in % between 0 and 100, e.g. 3")
    if from_run is not None:
        run = _load(from_run, str(kw["db"]) if kw["db"] else None)
    else:
        if kw["trials"] < 2:
            raise ConfigError(
                "--trials: calibration needs at least 2 trials per level (3 or more recommended)"
            )
        # Stored like any sweep, so `--from RUN_ID` can calibrate again with another --detect or --margin.
        run = measure(kw, calibrate_cmd.params)
    rows = calibrate(run, kw["metric"], detect, margin)
    _console().print(calibration_table(rows, kw["metric"]))
    if from_run is None and not run.meta.complete:
        click.echo(
            "warning: the run was interrupted; the calibration uses the trials that finished", err=True
        )


COMMANDS: list[click.Command] = [compare, calibrate_cmd, import_cmd]
