"""The results store: runs, trials and every request in SQLite (WAL), durable as each request finishes.

Each `add_record` is its own small transaction (synchronous=NORMAL): once it returns, the record survives the
process being killed (not a power cut). A run stays incomplete until `finish_run(complete=True)`.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import json
import os
import secrets
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import platformdirs

from tokbench.errors import ConfigError, StoreError
from tokbench.records import (
    ErrorKind,
    RequestRecord,
    RunMeta,
    RunResult,
    TrialResult,
    group_trials,
)
from tokbench.store.files import read_result_file
from tokbench.store.schema import migrate, schema_version

__all__ = [
    "RunCounts",
    "Store",
    "default_db_path",
    "load_run_arg",
    "parse_since",
    "read_result_file",
]

DB_ENV = "TOKBENCH_DB"  # overrides the default path (CI, tests, a shared campaign disk)
_CONFIG_KINDS = ("load", "server", "environment")
_META_FIELDS = tuple(
    f.name for f in dataclasses.fields(RunMeta) if f.name not in (*_CONFIG_KINDS, "complete")
)

_REQUEST_COLUMNS = (
    "run_id, concurrency, trial, attempt, idx, warmup, prompt_id, scheduled_ns, sent_ns, end_ns, "
    "first_token_ns, chunk_ns, chunk_tokens, output_text, prompt_tokens, completion_tokens, finish_reason, "
    "http_status, error_kind, error_message, extras, retried"
)
_INSERT_REQUEST = f"INSERT OR IGNORE INTO requests ({_REQUEST_COLUMNS}) VALUES ({', '.join('?' * 22)})"
_TRIAL_COLUMNS = (
    "run_id, concurrency, trial, attempt, ord, started_at, start_ns, end_ns, request_rate, loop_lag_p99_ms, "
    "loop_lag_max_ms, achieved_concurrency, client_limited, retry, interrupted, imported"
)
_INSERT_TRIAL = f"INSERT INTO trials ({_TRIAL_COLUMNS}) VALUES ({', '.join('?' * 16)})"

CellKey = tuple[str, int, int]  # run_id, concurrency, trial


def _enable_wal(conn: sqlite3.Connection, wait_s: float = 30.0) -> None:
    """Switch to WAL. While another process sets up the same new store, SQLite answers this pragma with
    'database is locked' at once instead of waiting out the busy timeout, so wait here as it would have."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def default_db_path() -> Path:
    """$TOKBENCH_DB, else platformdirs.user_data_dir("tokbench")/tokbench.db."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("tokbench")) / "tokbench.db"


def _json(obj: Any) -> str:
    # default=str: an environment value like a Path must not make a finished run unstorable.
    return json.dumps(obj, default=str, separators=(",", ":"))


def _meta_json(run_id: str, meta: RunMeta) -> str:
    """RunMeta as the runs table keeps it: every field but the configurations and `complete`."""
    return _json({**{name: getattr(meta, name) for name in _META_FIELDS}, "run_id": run_id})


def _config_rows(run_id: str, meta: RunMeta) -> list[tuple[str, str, str]]:
    return [(run_id, kind, _json(dict(getattr(meta, kind)))) for kind in _CONFIG_KINDS]


def _pack(values: Sequence[int], dtype: str) -> bytes:
    # array.array converts a tuple of ints about twice as fast as numpy; the blob is little-endian either way.
    packed = array.array("q" if dtype == "<i8" else "i", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack(blob: bytes | None, dtype: str) -> tuple[int, ...]:
    return tuple(np.frombuffer(blob, dtype=dtype).tolist()) if blob else ()


def _record_row(key: CellKey, attempt: int, r: RequestRecord) -> tuple[Any, ...]:
    run_id, concurrency, trial = key
    return (
        run_id, concurrency, trial, attempt, r.index, int(r.warmup), r.prompt_id, r.scheduled_ns, r.sent_ns,
        r.end_ns, r.first_token_ns, _pack(r.chunk_ns, "<i8"), _pack(r.chunk_tokens, "<i4"), r.output_text,
        r.prompt_tokens, r.completion_tokens, r.finish_reason, r.http_status,
        r.error_kind.value if r.error_kind else None, r.error_message, _json(dict(r.extras)), int(r.retried),
    )  # fmt: skip


def _record_from_row(row: sqlite3.Row) -> RequestRecord:
    kind = row["error_kind"]
    try:
        error_kind = ErrorKind(kind) if kind else None
    except ValueError:
        raise StoreError(
            f"requests.error_kind: unknown value {kind!r} (written by a newer tokbench?)"
        ) from None
    return RequestRecord(
        index=row["idx"],
        prompt_id=row["prompt_id"],
        scheduled_ns=row["scheduled_ns"],
        sent_ns=row["sent_ns"],
        end_ns=row["end_ns"],
        first_token_ns=row["first_token_ns"],
        chunk_ns=_unpack(row["chunk_ns"], "<i8"),
        chunk_tokens=_unpack(row["chunk_tokens"], "<i4"),
        output_text=row["output_text"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        finish_reason=row["finish_reason"],
        http_status=row["http_status"],
        error_kind=error_kind,
        error_message=row["error_message"],
        extras=json.loads(row["extras"]),
        retried=bool(row["retried"]),
        warmup=bool(row["warmup"]),
    )


def _epoch(iso: str) -> float:
    try:
        dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def parse_since(text: str, flag: str = "--since") -> datetime:
    """'2026-11-01', '2026-11-01T08:00' or a full ISO 8601 time (UTC unless it says otherwise)."""
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{flag}: {text!r} is not a date; use e.g. 2026-11-01 or 2026-11-01T08:00"
        ) from None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class RunCounts:
    """What `runs ls` shows beside a run's metadata: measured requests only."""

    levels: int
    trials: int
    requests: int
    ok: int


class Store:
    """One SQLite file of runs. Use from one thread at a time (a lock guards against accidents); cheap enough
    for the loadgen to call `add_record` from its event loop (measured here: ~0.1 ms per 100-token record,
    ~0.2-0.35 ms per 1000-token record, commit included)."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path).expanduser()
        self._clock = clock
        self._lock = threading.Lock()
        self._attempt: dict[CellKey, int] = {}  # the cell's current attempt
        self._closed: set[CellKey] = set()  # cells whose current attempt already has its trial row
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit mode: every statement outside an explicit BEGIN is its own transaction.
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"{self.path}: cannot open the results store ({e}); choose another --db") from e
        self._conn.row_factory = sqlite3.Row
        try:
            _enable_wal(self._conn)
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            migrate(self._conn, str(self.path))
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise StoreError(f"{self.path}: not a tokbench results store ({e}); choose another --db") from e
        except StoreError:
            self._conn.close()
            raise

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def version(self) -> int:
        return schema_version(self._conn)

    def _fail(self, what: str, e: sqlite3.Error) -> StoreError:
        return StoreError(f"{self.path}: {what} failed ({e})")

    # ---- writing -------------------------------------------------------------------------------------------

    def new_run_id(self) -> str:
        stamp = datetime.fromtimestamp(self._clock(), tz=timezone.utc).strftime("%Y%m%d-%H%M%S")
        return f"{stamp}-{secrets.token_hex(3)}"

    def _insert_run(self, meta: RunMeta, complete: bool) -> str:
        run_id = meta.run_id or self.new_run_id()
        if self._conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
            raise StoreError(f"run {run_id} is already in {self.path}; give the run another id")
        self._conn.execute(
            "INSERT INTO runs (run_id, label, started_at, complete, source, meta) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, meta.label, meta.started_at, int(complete), meta.source, _meta_json(run_id, meta)),
        )
        self._conn.executemany(
            "INSERT INTO configs (run_id, kind, body) VALUES (?, ?, ?)", _config_rows(run_id, meta)
        )
        return run_id

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[None]:
        """One write transaction, under the lock: committed, or rolled back on any exception (an sqlite error
        becomes a StoreError naming `what`)."""
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                yield
                self._conn.execute("COMMIT")
            except BaseException as e:
                self._conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise self._fail(what, e) from e
                raise

    def begin_run(self, meta: RunMeta) -> str:
        """Record the run's metadata and configurations; it stays incomplete until `finish_run`. Returns its
        id (meta.run_id, or a new one when that is empty)."""
        with self._transaction("begin_run"):
            return self._insert_run(meta, complete=False)

    def _next_attempt(self, key: CellKey) -> int:
        # A cell seen again after its trial row was written is a re-run (campaign retry): a new attempt.
        if key not in self._attempt:
            row = self._conn.execute(
                "SELECT MAX(attempt) FROM trials WHERE run_id = ? AND concurrency = ? AND trial = ?", key
            ).fetchone()
            self._attempt[key] = 0 if row[0] is None else row[0] + 1
        elif key in self._closed:
            self._attempt[key] += 1
            self._closed.discard(key)
        return self._attempt[key]

    def add_record(self, run_id: str, concurrency: int, trial: int, record: RequestRecord) -> None:
        """Store one finished request; committed (durable) when this returns."""
        key = (run_id, concurrency, trial)
        with self._lock:
            attempt = self._next_attempt(key)
            try:
                self._conn.execute(_INSERT_REQUEST, _record_row(key, attempt, record))
            except sqlite3.IntegrityError as e:
                raise StoreError(f"add_record: unknown run {run_id!r}; call begin_run first ({e})") from e
            except sqlite3.Error as e:
                raise self._fail("add_record", e) from e

    def _insert_trial(self, run_id: str, t: TrialResult) -> None:
        key = (run_id, t.concurrency, t.trial)
        attempt = self._next_attempt(key)
        self._conn.execute(
            _INSERT_TRIAL,
            (
                run_id, t.concurrency, t.trial, attempt, t.order, t.started_at, t.start_ns, t.end_ns,
                t.request_rate, t.loop_lag_p99_ms, t.loop_lag_max_ms, t.achieved_concurrency,
                int(t.client_limited), int(t.retry), int(t.interrupted),
                _json(dict(t.imported)) if t.imported is not None else None,
            ),
        )  # fmt: skip
        self._conn.executemany(
            "INSERT INTO scrapes (run_id, concurrency, trial, attempt, moment, body) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                (run_id, t.concurrency, t.trial, attempt, moment, body)
                for moment, body in (("before", t.metrics_before), ("after", t.metrics_after))
                if body is not None
            ],
        )
        # Records already streamed through add_record are ignored by the unique key; the rest land here.
        self._conn.executemany(_INSERT_REQUEST, [_record_row(key, attempt, r) for r in t.records])
        self._closed.add(key)

    def add_trial(self, run_id: str, trial: TrialResult) -> None:
        """Close a trial: its window, client self-check, scrapes, and any of its records not stored yet."""
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                self._insert_trial(run_id, trial)
                self._conn.execute("COMMIT")
            except BaseException as e:
                self._conn.execute("ROLLBACK")
                self._attempt.pop((run_id, trial.concurrency, trial.trial), None)
                if isinstance(e, sqlite3.IntegrityError):
                    raise StoreError(
                        f"add_trial: unknown run {run_id!r}, or trial C={trial.concurrency} #{trial.trial} "
                        f"stored twice ({e})"
                    ) from e
                if isinstance(e, sqlite3.Error):
                    raise self._fail("add_trial", e) from e
                raise

    def finish_run(self, run_id: str, complete: bool = True, meta: RunMeta | None = None) -> None:
        """Mark the run complete (or explicitly incomplete, e.g. after Ctrl-C). With `meta`, its metadata and
        configurations replace those `begin_run` saw: a campaign learns the model and the resolved server
        configuration only once the server is up."""
        with self._transaction("finish_run"):
            cur = self._conn.execute("UPDATE runs SET complete = ? WHERE run_id = ?", (int(complete), run_id))
            if cur.rowcount and meta is not None:
                self._conn.execute(
                    "UPDATE runs SET label = ?, meta = ? WHERE run_id = ?",
                    (meta.label, _meta_json(run_id, meta), run_id),
                )
                self._conn.executemany(
                    "INSERT OR REPLACE INTO configs (run_id, kind, body) VALUES (?, ?, ?)",
                    _config_rows(run_id, meta),
                )
        if cur.rowcount == 0:
            raise StoreError(f"finish_run: unknown run {run_id!r}")

    def save_run(self, run: RunResult) -> str:
        """Import a whole run (e.g. from a JSON result file) in one transaction; returns its id."""
        with self._lock:
            run_id = ""
            try:
                self._conn.execute("BEGIN")
                run_id = self._insert_run(run.meta, complete=run.meta.complete)
                for lv in run.levels:
                    for t in lv.trials:
                        self._insert_trial(run_id, t)
                self._conn.execute("COMMIT")
            except BaseException as e:
                self._conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise self._fail("save_run", e) from e
                raise
            finally:
                # The attempt bookkeeping is for runs being streamed; an imported run is closed.
                for key in [k for k in self._attempt if k[0] == run_id]:
                    self._attempt.pop(key)
                    self._closed.discard(key)
            return run_id

    def add_verdicts(
        self, run_a: str, run_b: str, metric: str, verdicts: Iterable[Mapping[str, Any]]
    ) -> None:
        """Record B-vs-A verdicts (`stats.compare.verdict_to_dict` per level) with the time they were made."""
        now = datetime.fromtimestamp(self._clock(), tz=timezone.utc).isoformat(timespec="seconds")
        rows = [
            (self.resolve(run_a), self.resolve(run_b), metric, int(v["concurrency"]), str(v["verdict"]),
             _json(dict(v)), now)
            for v in verdicts
        ]  # fmt: skip
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                self._conn.executemany(
                    "INSERT INTO verdicts (run_a, run_b, metric, concurrency, verdict, body, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                self._conn.execute("ROLLBACK")
                raise self._fail("add_verdicts", e) from e

    # ---- reading -------------------------------------------------------------------------------------------

    def resolve(self, run_id: str) -> str:
        """The full id of the run `run_id` names (a unique prefix is enough)."""
        if not run_id:
            raise StoreError("an empty run id; `tokbench runs ls` lists the runs")
        pattern = run_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._conn.execute(
            "SELECT run_id FROM runs WHERE run_id = ? OR run_id LIKE ? ESCAPE '\\' ORDER BY run_id LIMIT 6",
            (run_id, pattern),
        ).fetchall()
        ids = [str(r[0]) for r in rows]
        if run_id in ids:
            return run_id
        if not ids:
            raise StoreError(f"no run {run_id!r} in {self.path}; `tokbench runs ls` lists the runs")
        if len(ids) > 1:
            raise StoreError(f"run id {run_id!r} is ambiguous in {self.path}: {', '.join(ids[:5])} ...")
        return ids[0]

    def _meta(self, row: sqlite3.Row) -> RunMeta:
        body = json.loads(row["meta"])
        configs = {
            r["kind"]: json.loads(r["body"])
            for r in self._conn.execute("SELECT kind, body FROM configs WHERE run_id = ?", (row["run_id"],))
        }
        fields = {k: v for k, v in body.items() if k in _META_FIELDS}
        fields.update({k: configs.get(k, {}) for k in _CONFIG_KINDS})
        # The columns are what list/filter/finish_run act on, so they win over the JSON copy.
        fields.update({k: row[k] for k in ("run_id", "label", "started_at", "source")})
        try:
            return RunMeta(**fields, complete=bool(row["complete"]))
        except TypeError as e:
            raise StoreError(f"{self.path}: run {row['run_id']}: unreadable metadata ({e})") from None

    def load_run(self, run_id: str, *, superseded: bool = False) -> RunResult:
        """The run with its trials and records. Records whose trial never closed (a killed run) come back as
        an interrupted trial spanning them. A cell that was re-run (campaign retry after a server crash) shows
        its last attempt only, as the campaign's result file does; `superseded=True` keeps every attempt."""
        with self._lock:
            full = self.resolve(run_id)
            run_row = self._conn.execute("SELECT * FROM runs WHERE run_id = ?", (full,)).fetchone()
            meta = self._meta(run_row)
            records: dict[tuple[int, int, int], list[RequestRecord]] = {}
            for row in self._conn.execute("SELECT * FROM requests WHERE run_id = ? ORDER BY seq", (full,)):
                cell = (row["concurrency"], row["trial"], row["attempt"])
                records.setdefault(cell, []).append(_record_from_row(row))
            scrapes = {
                (r["concurrency"], r["trial"], r["attempt"], r["moment"]): r["body"]
                for r in self._conn.execute("SELECT * FROM scrapes WHERE run_id = ?", (full,))
            }
            attempts: list[tuple[int, TrialResult]] = []
            for row in self._conn.execute("SELECT * FROM trials WHERE run_id = ?", (full,)):
                cell = (row["concurrency"], row["trial"], row["attempt"])
                attempts.append(
                    (
                        row["attempt"],
                        TrialResult(
                            concurrency=row["concurrency"],
                            trial=row["trial"],
                            order=row["ord"],
                            started_at=row["started_at"],
                            start_ns=row["start_ns"],
                            end_ns=row["end_ns"],
                            records=tuple(records.pop(cell, ())),
                            request_rate=row["request_rate"],
                            loop_lag_p99_ms=row["loop_lag_p99_ms"],
                            loop_lag_max_ms=row["loop_lag_max_ms"],
                            achieved_concurrency=row["achieved_concurrency"],
                            client_limited=bool(row["client_limited"]),
                            metrics_before=scrapes.get((*cell, "before")),
                            metrics_after=scrapes.get((*cell, "after")),
                            retry=bool(row["retry"]),
                            interrupted=bool(row["interrupted"]),
                            imported=json.loads(row["imported"]) if row["imported"] is not None else None,
                        ),
                    )
                )
        next_order = max((t.order for _, t in attempts), default=-1) + 1
        # dicts keep insertion order, which follows seq: unclosed cells come in the order they started.
        for i, ((c, trial, attempt), recs) in enumerate(records.items()):
            measured = [r for r in recs if not r.warmup] or recs
            attempts.append(
                (
                    attempt,
                    TrialResult(
                        concurrency=c,
                        trial=trial,
                        order=next_order + i,
                        started_at=_epoch(meta.started_at),
                        start_ns=min(r.scheduled_ns for r in measured),
                        end_ns=max(r.end_ns for r in measured),
                        records=tuple(recs),
                        retry=attempt > 0,
                        interrupted=True,
                    ),
                )
            )
        if not superseded:
            last: dict[tuple[int, int], int] = {}
            for attempt, t in attempts:
                last[(t.concurrency, t.trial)] = max(attempt, last.get((t.concurrency, t.trial), 0))
            attempts = [(a, t) for a, t in attempts if a == last[(t.concurrency, t.trial)]]
        return RunResult(meta, group_trials([t for _, t in attempts]))

    def list_runs(self, label: str | None = None, since: str | datetime | None = None) -> list[RunMeta]:
        """Runs newest first, optionally only those with `label` or started at or after `since`."""
        cutoff = parse_since(since) if isinstance(since, str) else since
        if cutoff is not None and cutoff.tzinfo is None:
            cutoff = cutoff.replace(tzinfo=timezone.utc)
        query, args = "SELECT * FROM runs", tuple[str, ...]()
        if label is not None:
            query, args = query + " WHERE label = ?", (label,)
        with self._lock:
            metas = [self._meta(row) for row in self._conn.execute(query, args)]
        if cutoff is not None:
            metas = [m for m in metas if _epoch(m.started_at) >= cutoff.timestamp()]
        return sorted(metas, key=lambda m: (_epoch(m.started_at), m.run_id), reverse=True)

    def counts(self) -> dict[str, RunCounts]:
        """Per run id: levels, trials and measured requests (ok of them) stored so far."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT run_id, COUNT(DISTINCT concurrency) AS levels, "
                "COUNT(DISTINCT concurrency || ':' || trial || ':' || attempt) AS trials, "
                "COUNT(*) AS requests, SUM(error_kind IS NULL) AS ok FROM requests WHERE warmup = 0 "
                "GROUP BY run_id"
            ).fetchall()
        return {r["run_id"]: RunCounts(r["levels"], r["trials"], r["requests"], r["ok"] or 0) for r in rows}

    def verdicts(self, run_a: str | None = None, run_b: str | None = None) -> list[dict[str, Any]]:
        """Stored verdicts (each the dict given to add_verdicts plus run_a, run_b, metric, created_at)."""
        query, args = "SELECT * FROM verdicts WHERE 1 = 1", []
        for column, value in (("run_a", run_a), ("run_b", run_b)):
            if value is not None:
                query += f" AND {column} = ?"
                args.append(self.resolve(value))
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY id", args).fetchall()
        return [
            {**json.loads(r["body"]), "run_a": r["run_a"], "run_b": r["run_b"], "metric": r["metric"],
             "created_at": r["created_at"]}
            for r in rows
        ]  # fmt: skip


def load_run_arg(arg: str, db: str | Path | None) -> RunResult:
    """A run named on the command line: a path to a JSON result file, or a run id (or unique prefix) in the
    store at `db` (default: `default_db_path()`)."""
    path = Path(arg).expanduser()
    if path.is_file():
        return read_result_file(path)
    if arg.endswith(".json"):
        raise StoreError(f"{arg}: no such result file")
    db_path = Path(db).expanduser() if db is not None else default_db_path()
    if not db_path.is_file():
        raise StoreError(f"{arg!r} is neither a result file nor a run id: no results store at {db_path}")
    with Store(db_path) as store:
        return store.load_run(arg)
