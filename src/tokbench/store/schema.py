"""SQLite schema: an append-only tuple of migration scripts; PRAGMA user_version counts those applied.

Never edit a released script: add the change as the next one, so every older database upgrades the same way.
"""

from __future__ import annotations

import sqlite3

from tokbench.errors import StoreError

# v1: runs, their configurations, trials, requests and metric scrapes.
_V1 = """
CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    label       TEXT NOT NULL DEFAULT '',
    started_at  TEXT NOT NULL,              -- ISO 8601, as RunMeta has it
    complete    INTEGER NOT NULL DEFAULT 0, -- 1 only once finish_run(complete=True) ran
    source      TEXT NOT NULL DEFAULT 'tokbench',
    meta        TEXT NOT NULL               -- RunMeta as JSON, without load/server/environment
);
CREATE TABLE configs (                      -- the LoadSpec, the resolved server config, the environment
    run_id  TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    kind    TEXT NOT NULL,                  -- 'load' | 'server' | 'environment'
    body    TEXT NOT NULL,                  -- JSON
    PRIMARY KEY (run_id, kind)
);
CREATE TABLE trials (
    run_id       TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    concurrency  INTEGER NOT NULL,
    trial        INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,          -- 0, then 1 for a re-run of the same cell (TrialResult.retry)
    ord          INTEGER NOT NULL,
    started_at   REAL NOT NULL,
    start_ns     INTEGER NOT NULL,
    end_ns       INTEGER NOT NULL,
    request_rate REAL,
    loop_lag_p99_ms REAL,
    loop_lag_max_ms REAL,
    achieved_concurrency REAL,
    client_limited INTEGER NOT NULL DEFAULT 0,
    retry        INTEGER NOT NULL DEFAULT 0,
    interrupted  INTEGER NOT NULL DEFAULT 0,
    imported     TEXT,                      -- JSON figures of a summary-only import
    PRIMARY KEY (run_id, concurrency, trial, attempt)
);
CREATE TABLE requests (
    seq          INTEGER PRIMARY KEY,       -- insertion order
    run_id       TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    concurrency  INTEGER NOT NULL,
    trial        INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    idx          INTEGER NOT NULL,
    warmup       INTEGER NOT NULL,
    prompt_id    TEXT NOT NULL,
    scheduled_ns INTEGER NOT NULL,
    sent_ns      INTEGER NOT NULL,
    end_ns       INTEGER NOT NULL,
    first_token_ns INTEGER,
    chunk_ns     BLOB NOT NULL,             -- little-endian int64 array
    chunk_tokens BLOB NOT NULL,             -- little-endian int32 array
    output_text  TEXT NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    finish_reason TEXT,
    http_status  INTEGER,
    error_kind   TEXT,
    error_message TEXT,
    extras       TEXT NOT NULL,             -- JSON
    retried      INTEGER NOT NULL,
    UNIQUE (run_id, concurrency, trial, attempt, warmup, idx)
);
CREATE TABLE scrapes (                      -- raw Prometheus text around each measurement window
    run_id      TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    concurrency INTEGER NOT NULL,
    trial       INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    moment      TEXT NOT NULL,              -- 'before' | 'after'
    body        TEXT NOT NULL,
    PRIMARY KEY (run_id, concurrency, trial, attempt, moment)
);
"""

# v2: verdicts of compared runs, and indexes for `runs ls --label/--since`.
_V2 = """
CREATE TABLE verdicts (
    id          INTEGER PRIMARY KEY,
    run_a       TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    run_b       TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    metric      TEXT NOT NULL,
    concurrency INTEGER NOT NULL,
    verdict     TEXT NOT NULL,
    body        TEXT NOT NULL,              -- verdict_to_dict as JSON
    created_at  TEXT NOT NULL
);
CREATE INDEX verdicts_pair ON verdicts (run_a, run_b, metric);
CREATE INDEX runs_started ON runs (started_at);
CREATE INDEX runs_label ON runs (label);
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2)
LATEST = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, where: str, target: int = LATEST) -> int:
    """Apply the missing scripts, each in its own transaction with its version bump; returns the version."""
    current = schema_version(conn)
    if current > LATEST:
        raise StoreError(
            f"{where}: schema version {current} is newer than this tokbench knows ({LATEST}); "
            "upgrade tokbench, or use another --db"
        )
    for version in range(current + 1, target + 1):
        # executescript commits first; BEGIN IMMEDIATE..COMMIT inside makes each step all-or-nothing and takes
        # the write lock up front, so a second process opening the same store waits instead of interleaving.
        try:
            script = MIGRATIONS[version - 1]
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {version};\nCOMMIT;")
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if schema_version(conn) >= version:
                continue  # another process opening the same store applied this step first
            raise StoreError(f"{where}: upgrading the schema to version {version} failed: {e}") from e
    return schema_version(conn)
