"""Schema migrations: from an empty file and from every older version to the same schema, data kept."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tokbench.errors import StoreError
from tokbench.store import Store
from tokbench.store.schema import LATEST, MIGRATIONS, migrate


def schema(path: Path) -> set[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    finally:
        conn.close()
    return {(name, " ".join(sql.split())) for name, sql in rows}


def at_version(path: Path, version: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, str(path), target=version) == version
    return conn


def test_an_empty_file_gets_the_latest_schema(tmp_path: Path) -> None:
    with Store(tmp_path / "new.db") as store:
        assert store.version == LATEST == len(MIGRATIONS)
    names = {name for name, _ in schema(tmp_path / "new.db")}
    assert {"runs", "configs", "trials", "requests", "scrapes", "verdicts"} <= names


@pytest.mark.parametrize("version", range(LATEST))
def test_every_older_version_upgrades_to_the_same_schema(tmp_path: Path, version: int) -> None:
    at_version(tmp_path / "old.db", version).close()
    with Store(tmp_path / "old.db") as store:
        assert store.version == LATEST
    with Store(tmp_path / "fresh.db"):
        pass
    assert schema(tmp_path / "old.db") == schema(tmp_path / "fresh.db")


def _open_at_once(path: str, barrier: Any, errors: Any) -> None:
    barrier.wait()
    try:
        Store(path).close()
    except StoreError as e:
        errors.put(str(e))


def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    # A campaign, a report and a `runs ls` may open the same fresh --db together; all must see one schema.
    ctx = multiprocessing.get_context("fork")
    for round_ in range(10):
        path = str(tmp_path / f"race{round_}.db")
        barrier, errors = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(path, barrier, errors)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 4
        assert errors.empty(), errors.get()
        with Store(path) as store:
            assert store.version == LATEST


def test_a_v1_store_keeps_its_runs_and_gains_verdicts(tmp_path: Path) -> None:
    # Written with the v1 script only, the way tokbench 0.1 left it on disk.
    path = tmp_path / "v1.db"
    conn = at_version(path, 1)
    meta = '{"run_id": "old-run", "label": "base", "tool_version": "0.0.9", "model": "m"}'
    conn.execute(
        "INSERT INTO runs VALUES ('old-run', 'base', '2026-10-01T00:00:00+00:00', 1, 'tokbench', ?)", (meta,)
    )
    conn.execute("""INSERT INTO configs VALUES ('old-run', 'server', '{"engine": "vllm"}')""")
    conn.execute(
        "INSERT INTO trials (run_id, concurrency, trial, attempt, ord, started_at, start_ns, end_ns) "
        "VALUES ('old-run', 4, 0, 0, 0, 1759276800.0, 100, 9000000100)"
    )
    chunk_ns = (1000).to_bytes(8, "little") + (2000 + 10**9).to_bytes(8, "little")
    conn.execute(
        "INSERT INTO requests (run_id, concurrency, trial, attempt, idx, warmup, prompt_id, scheduled_ns,"
        " sent_ns, end_ns, first_token_ns, chunk_ns, chunk_tokens, output_text, completion_tokens, extras,"
        " retried)"
        " VALUES ('old-run', 4, 0, 0, 0, 0, 'p0', 100, 200, 2000000000, 1000, ?, ?, 'hi', 2, '{}', 0)",
        (chunk_ns, (1).to_bytes(4, "little") * 2),
    )
    conn.close()
    assert "verdicts" not in {name for name, _ in schema(path)}

    with Store(path) as store:
        assert store.version == LATEST
        run = store.load_run("old")
        assert run.meta.tool_version == "0.0.9" and run.meta.server == {"engine": "vllm"}
        [rec] = run.levels[0].trials[0].records
        assert rec.chunk_ns == (1000, 2000 + 10**9) and rec.chunk_tokens == (1, 1) and rec.output_tokens == 2
        verdict = {"concurrency": 4, "verdict": "no_difference"}
        store.add_verdicts("old-run", "old-run", "agg_tok_s", [verdict])
        assert store.verdicts("old-run")[0]["verdict"] == "no_difference"


def test_a_newer_store_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = at_version(path, LATEST)
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.close()
    with pytest.raises(StoreError, match=rf"schema version {LATEST + 1} is newer than this tokbench knows"):
        Store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST + 1
    conn.close()


def test_a_failing_migration_rolls_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokbench.store import schema as schema_module

    path = tmp_path / "half.db"
    at_version(path, LATEST - 1).close()
    before = schema(path)
    broken = (*MIGRATIONS[:-1], "CREATE TABLE half_done (x INTEGER);\nTHIS IS NOT SQL;")
    monkeypatch.setattr(schema_module, "MIGRATIONS", broken)
    with pytest.raises(StoreError, match=f"upgrading the schema to version {LATEST} failed"):
        Store(path)
    assert schema(path) == before
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST - 1
    conn.close()
