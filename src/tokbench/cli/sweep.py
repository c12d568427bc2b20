"""CLI: `tokbench sweep` — N streamed requests per concurrency level and trial, the seed's table on stdout,
raw records to a JSON file and the results store. Ctrl-C keeps every finished record and exits 130.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tokbench.config import LoadSpec, parse_levels
from tokbench.errors import ConfigError
from tokbench.loadgen.client import fetch_text
from tokbench.loadgen.runner import Progress as SweepProgress
from tokbench.loadgen.runner import sweep_sync
from tokbench.records import RequestRecord, RunMeta, RunResult, TrialResult
from tokbench.report.export import write_result_json
from tokbench.report.terminal import seed_table
from tokbench.store import Store, default_db_path

EXIT_INTERRUPTED = 130


class StoreWriter:
    """A sweep's records into the results store as they finish (`db` None: the default store), or nowhere
    when not `enabled`. A context manager around the sweep; `finish(run)` once it returned."""

    def __init__(self, db: str | Path | None, enabled: bool = True) -> None:
        path = Path(db).expanduser() if db else default_db_path()
        self.store = Store(path) if enabled else None
        self.run_id: str | None = None

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.store is not None:
            self.store.close()

    def on_start(self, meta: RunMeta) -> None:
        if self.store is not None:
            self.run_id = self.store.begin_run(meta)

    def on_record(self, c: int, t: int, r: RequestRecord) -> None:
        if self.store is not None and self.run_id is not None:
            self.store.add_record(self.run_id, c, t, r)

    def on_trial(self, t: TrialResult) -> None:
        if self.store is not None and self.run_id is not None:
            self.store.add_trial(self.run_id, t)

    def finish(self, run: RunResult) -> None:
        if self.store is not None and self.run_id is not None:
            self.store.finish_run(self.run_id, complete=run.meta.complete, meta=run.meta)


def build_spec(values: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> LoadSpec:
    """A LoadSpec from CLI values; a ConfigError naming each bad flag (`flags`: field name -> flag)."""
    try:
        return LoadSpec(**values)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            lines.append(f"{(flags or {}).get(field, field)}: {err['msg']}")
        raise ConfigError("; ".join(lines)) from None


def parse_extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--extra-body: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(body, dict):
        raise ConfigError("--extra-body: expected a JSON object, e.g. '{\"top_k\": 20}'")
    return body


def api_key_from_env(name: str | None) -> str | None:
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"--api-key-env: environment variable {name} is not set or empty")
    return key


class _Bars:
    """One progress bar per level (all its trials), on stderr."""

    def __init__(self, spec: LoadSpec, console: Console) -> None:
        self.progress = Progress(
            TextColumn("C={task.fields[c]:>4}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[errors]} err"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[int, TaskID] = {}
        self._done: dict[tuple[int, int], tuple[int, int]] = {}
        for c in dict.fromkeys(spec.concurrencies):
            total = spec.requests_for(c) * spec.trials
            self._tasks[c] = self.progress.add_task("", total=total, c=c, errors=0)

    def update(self, p: SweepProgress) -> None:
        self._done[(p.concurrency, p.trial)] = (p.done, p.errors)
        done = sum(d for (c, _), (d, _) in self._done.items() if c == p.concurrency)
        errors = sum(e for (c, _), (_, e) in self._done.items() if c == p.concurrency)
        self.progress.update(self._tasks[p.concurrency], completed=done, errors=errors)


# The options of one measured run, shared by `sweep` and `calibrate`: an A/A run must be the A/B's workload.
LOAD_OPTIONS = [
    click.option("--model", default=None, help="model name [default: the first id from /v1/models]"),
    click.option(
        "--api", type=click.Choice(["chat", "completions", "sglang"]), default="chat", show_default=True
    ),
    click.option(
        "-c",
        "--concurrency",
        "concurrencies",
        default="1,4,16,32",
        show_default=True,
        help="comma-separated concurrency levels",
    ),
    click.option("--requests", type=int, default=None, help="requests per trial [default: max(4, 2*C)]"),
    click.option(
        "--order",
        type=click.Choice(["interleaved", "shuffled", "blocked"]),
        default="interleaved",
        show_default=True,
        help="trial order across levels",
    ),
    click.option(
        "--warmup", type=int, default=2, show_default=True, help="unmeasured requests before the first trial"
    ),
    click.option("--max-tokens", type=int, default=1000, show_default=True),
    click.option(
        "--ignore-eos/--no-ignore-eos",
        default=True,
        show_default=True,
        help="generate exactly --max-tokens (equal work for comparisons)",
    ),
    click.option("--min-tokens", type=int, default=None),
    click.option("--temperature", type=float, default=0.0, show_default=True),
    click.option("--top-p", type=float, default=None),
    click.option("--seed", type=int, default=0, show_default=True, help="workload and schedule seed"),
    click.option("--request-seed", type=int, default=None, help="the request body's `seed`"),
    click.option("--extra-body", default=None, help="JSON object merged into every request body"),
    click.option(
        "--prompts", default="builtin", show_default=True, help="'builtin' or a JSONL / ShareGPT file"
    ),
    click.option(
        "--prompt-format", type=click.Choice(["auto", "jsonl", "sharegpt"]), default="auto", show_default=True
    ),
    click.option("--same-prompts", is_flag=True, help="every level and trial sends the same prompt sequence"),
    click.option("--request-rate", type=float, default=None, help="open loop: Poisson arrivals per second"),
    click.option(
        "--timeout",
        "timeout_s",
        type=float,
        default=600.0,
        show_default=True,
        help="per-request deadline, seconds",
    ),
    click.option(
        "--stall-timeout",
        "stall_timeout_s",
        type=float,
        default=60.0,
        show_default=True,
        help="fail a request after this many seconds without a byte",
    ),
    click.option(
        "--lag-threshold-ms",
        type=float,
        default=50.0,
        show_default=True,
        help="event-loop lag p99 above this flags a level client-limited",
    ),
    click.option("--api-key-env", default=None, help="name of the environment variable holding the API key"),
    click.option(
        "--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="result JSON file"
    ),
    click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="results store [default: the user data directory, or $TOKBENCH_DB]",
    ),
    click.option("--no-store", is_flag=True, help="do not write the results store"),
    click.option(
        "--metrics-url",
        default=None,
        help="Prometheus text scraped around each trial [default: BASE_URL/metrics]; 'none' to skip",
    ),
]


def load_options(f: Any) -> Any:
    """Apply LOAD_OPTIONS to a click command function, in the order they are listed."""
    for option in reversed(LOAD_OPTIONS):
        f = option(f)
    return f


@click.command("sweep")
@click.option("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8080")
@click.option("--trials", type=int, default=1, show_default=True, help="trials per level")
@click.option("--label", default="", help="a name for this run")
@load_options
def sweep(**kw: Any) -> None:
    """Measure throughput and latency at each concurrency level and print the seed's table."""
    run = measure(kw, sweep.params)
    if not run.meta.complete:
        Console(stderr=True).print(
            "interrupted: every finished request was kept; the run is marked incomplete"
        )
        raise SystemExit(EXIT_INTERRUPTED)


def measure(kw: Mapping[str, Any], params: Sequence[click.Parameter]) -> RunResult:
    """One run from a command's LOAD_OPTIONS (plus base_url, trials, label): progress bars on stderr, every
    finished request into the store, the result file, then the seed's table on stdout. Ctrl-C ends it with
    the trials that finished (meta.complete False)."""
    fields = set(LoadSpec.model_fields)
    values = {k: v for k, v in kw.items() if k in fields}
    values["concurrencies"] = parse_levels(kw["concurrencies"])
    values["extra_body"] = parse_extra_body(kw["extra_body"])
    spec = build_spec(values, {p.name: p.opts[-1] for p in params if p.name in fields})
    if spec.prompts != "builtin" and not Path(spec.prompts).expanduser().is_file():
        raise ConfigError(
            f"--prompts: no such file {spec.prompts!r}; pass a JSONL / ShareGPT file or 'builtin'"
        )
    api_key = api_key_from_env(spec.api_key_env)
    metrics_url = kw["metrics_url"] or spec.base_url + "/metrics"
    out: Path | None = kw["out"]
    err = Console(stderr=True)
    stdout = Console(soft_wrap=False, width=None if Console().is_terminal else 200)

    writer = StoreWriter(kw["db"], enabled=not kw["no_store"])

    async def scrape() -> str | None:
        return await fetch_text(metrics_url, "")

    bars = _Bars(spec, err)
    with writer:
        with bars.progress:
            run = sweep_sync(
                spec,
                api_key=api_key,
                label=spec.label,
                on_start=writer.on_start,
                on_record=writer.on_record,
                on_progress=bars.update,
                on_trial=writer.on_trial,
                scrape=None if metrics_url.lower() == "none" else scrape,
            )
        writer.finish(run)
    run_id = writer.run_id
    if out is not None:  # the data first, then the rendering
        write_result_json(run, out.expanduser())
        err.print(f"wrote {out}")
    stdout.print(seed_table(run))
    if run_id is not None:
        err.print(f"stored as run {run_id[:12]}")
    return run


COMMANDS: list[click.Command] = [sweep]
