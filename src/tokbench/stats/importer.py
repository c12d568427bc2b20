"""Summary-only results from other tools: tables in the seed's layout (`C | Agg tok/s | Per-req tok/s | Tokens
| Wall(s) | Ok`, pipe-markdown or CSV) become a RunResult whose trials carry `imported` figures and no
records.

Several tables in one file are several trials (in order); a CSV may instead carry a `trial` column."""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections.abc import Mapping, Sequence

from tokbench import __version__
from tokbench.errors import ConfigError
from tokbench.records import RunMeta, RunResult, TrialResult, group_trials

# Column names are matched after lower-casing and dropping everything but letters and digits,
# so "Agg tok/s", "agg_tok_s" and "AGG TOK S" are one name.
_ALIASES: dict[str, str] = {
    **dict.fromkeys(("c", "concurrency", "conc", "maxconcurrency"), "concurrency"),
    **dict.fromkeys(
        ("aggtoks", "aggtokps", "aggtoksec", "aggregatetoks", "outputtoks", "outputthroughput"), "agg_tok_s"
    ),
    **dict.fromkeys(("perreqtoks", "perrequesttoks", "perreqtoksec", "perreqtokps"), "per_req_tok_s"),
    **dict.fromkeys(("tokens", "outputtokens"), "tokens"),
    **dict.fromkeys(("walls", "wall", "walltime", "walltimes", "duration", "durations"), "wall_s"),
    **dict.fromkeys(("ok", "completed", "successful", "success"), "ok"),
    "trial": "trial",
}
FIGURES = ("agg_tok_s", "per_req_tok_s", "tokens", "wall_s", "ok")
_SEPARATOR = re.compile(r"^[\s|:+=-]*-[\s|:+=-]*$")  # a rule: only dashes, pipes, colons, plus, equals

Table = dict[int, dict[str, float]]  # concurrency -> figures of one trial


def _column(name: str) -> str | None:
    return _ALIASES.get(re.sub(r"[^a-z0-9]", "", name.lower()))


def _cells(line: str) -> list[str]:
    cells = [c.strip() for c in line.strip().split("|")]
    if cells and cells[0] == "":
        cells = cells[1:]
    if cells and cells[-1] == "":
        cells = cells[:-1]
    return cells


def _header(cells: Sequence[str]) -> list[str | None] | None:
    cols = [_column(c) for c in cells]
    return cols if "concurrency" in cols and "agg_tok_s" in cols else None


def _number(text: str, where: str, column: str) -> float | None:
    t = text.strip().strip("*`").replace(",", "").replace("_", "")
    if t in ("", "-", "—", "n/a", "NA"):
        return None
    if column == "ok" and "/" in t:  # "8/8": OK of requests
        t = t.split("/", 1)[0]
    try:
        return float(t)
    except ValueError:
        raise ConfigError(f"{where}: column {column!r}: {text.strip()!r} is not a number") from None


def _row(cols: Sequence[str | None], cells: Sequence[str], where: str) -> tuple[int, dict[str, float]]:
    if len(cells) != len(cols):
        raise ConfigError(f"{where}: {len(cells)} cells but the header has {len(cols)} columns")
    figures: dict[str, float] = {}
    for col, cell in zip(cols, cells, strict=True):
        if col is None:
            continue
        v = _number(cell, where, col)
        if v is not None:
            figures[col] = v
    c = figures.pop("concurrency", None)
    if c is None or c != int(c) or c < 1:
        raise ConfigError(f"{where}: the concurrency cell must be a positive integer")
    if "agg_tok_s" not in figures:
        raise ConfigError(f"{where}: no Agg tok/s value for C={int(c)}")
    return int(c), figures


def _add(table: Table, c: int, figures: dict[str, float], where: str) -> None:
    if c in table:
        raise ConfigError(f"{where}: C={c} appears twice in one table; put each trial in its own table")
    table[c] = figures


def parse_pipe_tables(text: str, source: str = "input") -> list[Table]:
    """Pipe tables (the seed's `C | Agg tok/s | ...` with a dashed rule, or markdown `| C | ... |`) anywhere
    in the text, prose around them ignored; one table per trial."""
    tables: list[Table] = []
    cols: list[str | None] | None = None
    current: Table = {}
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{source}:{n}"
        if cols is not None:
            if _SEPARATOR.match(line) and not current:
                continue
            cells = _cells(line) if "|" in line else []
            if cells and _header(cells) is None and re.match(r"^\s*\|?\s*\d", line):
                c, figures = _row(cols, cells, where)
                _add(current, c, figures, where)
                continue
            if current:
                tables.append(current)
            cols, current = None, {}
        if "|" in line:
            cols = _header(_cells(line))
    if cols is not None and current:
        tables.append(current)
    return tables


def parse_csv_tables(text: str, source: str = "input") -> list[Table]:
    """CSV with a header row naming at least C and Agg tok/s; blank lines or a repeated header start the next
    trial, or a `trial` column says which trial each row belongs to."""
    by_trial: dict[int, Table] = {}
    tables: list[Table] = []
    cols: list[str | None] | None = None
    current: Table = {}
    reader = csv.reader(io.StringIO(text))
    for cells in reader:
        where = f"{source}:{reader.line_num}"
        if not any(c.strip() for c in cells):
            if current:
                tables.append(current)
            current = {}
            continue
        header = _header(cells)
        if header is not None:
            if current:
                tables.append(current)
            cols, current = header, {}
            continue
        if cols is None:
            continue  # prose or comments before the header
        c, figures = _row(cols, cells, where)
        trial = figures.pop("trial", None)
        if trial is not None:
            _add(by_trial.setdefault(int(trial), {}), c, figures, where)
        else:
            _add(current, c, figures, where)
    if current:
        tables.append(current)
    return tables + [by_trial[k] for k in sorted(by_trial)]


def parse_tables(text: str, source: str = "input") -> list[Table]:
    """Pipe tables if the text has any, else CSV. ConfigError naming the line when nothing can be read."""
    tables = parse_pipe_tables(text, source)
    if not tables and "|" not in text:
        tables = parse_csv_tables(text, source)
    if not tables:
        raise ConfigError(
            f"{source}: no results table found; expected a header like "
            "'C | Agg tok/s | Per-req tok/s | Tokens | Wall(s) | Ok' (markdown or CSV), one row per level"
        )
    return tables


def tables_to_run(
    tables: Sequence[Mapping[int, Mapping[str, float]]], *, source: str, label: str, started_at: str
) -> RunResult:
    """A RunResult with one imported trial per (table, level); trial order follows the tables."""
    trials = []
    order = 0
    for k, table in enumerate(tables):
        for c in sorted(table):
            figures = {f: float(v) for f, v in table[c].items() if f in FIGURES}
            wall = figures.get("wall_s")
            trials.append(
                TrialResult(
                    concurrency=c,
                    trial=k,
                    order=order,
                    started_at=0.0,
                    start_ns=0,
                    end_ns=int(wall * 1e9) if wall else 0,
                    imported=figures,
                )
            )
            order += 1
    digest = hashlib.sha256(repr((source, label, [sorted(t.items()) for t in tables])).encode()).hexdigest()
    meta = RunMeta(
        run_id=f"import-{digest[:12]}",
        label=label,
        tool_version=__version__,
        started_at=started_at,
        source=f"import:{source}",
    )
    return RunResult(meta, group_trials(trials))


def import_summary(text: str, *, source: str, label: str, started_at: str) -> RunResult:
    """Parse summary tables from `text` (named `source` in errors) into a result compare accepts."""
    return tables_to_run(parse_tables(text, source), source=source, label=label, started_at=started_at)
