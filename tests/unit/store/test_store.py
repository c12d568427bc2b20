"""Store: records stream in and come back exactly; interrupted runs, retries, ids, listing, verdicts."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from tokbench.errors import ConfigError, StoreError
from tokbench.records import (
    ErrorKind,
    RequestRecord,
    RunMeta,
    RunResult,
    TrialResult,
    group_trials,
    run_to_dict,
)
from tokbench.store import Store, load_run_arg

MS = 1_000_000


def record(i: int, t0: int, *, error: bool = False, warmup: bool = False) -> RequestRecord:
    if error:
        return RequestRecord(
            index=i, prompt_id=f"p{i}", scheduled_ns=t0, sent_ns=t0 + 1, end_ns=t0 + 9 * MS,
            http_status=429, error_kind=ErrorKind.HTTP_STATUS, error_message="HTTP 429: slow down",
        )  # fmt: skip
    chunks = tuple(t0 + (20 + 7 * k) * MS for k in range(6))
    return RequestRecord(
        index=i,
        prompt_id=f"p{i}",
        scheduled_ns=t0,
        sent_ns=t0 + 5_000,
        end_ns=chunks[-1] + 1,
        first_token_ns=chunks[0],
        chunk_ns=chunks,
        chunk_tokens=(1, 1, 3, 1, 2, 1),
        output_text="héllo wörld",
        prompt_tokens=12,
        completion_tokens=9,
        finish_reason="length",
        http_status=200,
        extras={"timings": {"draft_n": 4, "draft_n_accepted": 3}},
        retried=i == 1,
        warmup=warmup,
    )


def trial(c: int, k: int, order: int, n: int = 3, **kw: object) -> TrialResult:
    t0 = 10**12 + order * 10**9
    recs = tuple(record(i, t0 + i * MS, error=(i == n - 1 and c > 1)) for i in range(n))
    base = TrialResult(
        concurrency=c, trial=k, order=order, started_at=1_780_000_000.5 + order, start_ns=t0,
        end_ns=max(r.end_ns for r in recs), records=recs, loop_lag_p99_ms=0.3, loop_lag_max_ms=1.5,
        achieved_concurrency=c * 0.98, metrics_before="# HELP x\nx 1\n", metrics_after="x 5\n",
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def meta(run_id: str = "r1", label: str = "base", started_at: str = "2026-11-01T10:00:00+00:00") -> RunMeta:
    return RunMeta(
        run_id=run_id, label=label, tool_version="0.1.0", started_at=started_at,
        base_url="http://127.0.0.1:1", model="m", load={"concurrencies": [1, 2], "trials": 2},
        server={"engine": "generic", "resolved": {"attention_backend": "fa3", "page_size": 64}},
        environment={"host": "box", "gpus": []}, complete=True,
    )  # fmt: skip


def a_run(run_id: str = "r1") -> RunResult:
    trials = [trial(1, 0, 0), trial(2, 0, 1), trial(1, 1, 2), trial(2, 1, 3, imported=None, request_rate=2.5)]
    return RunResult(meta(run_id), group_trials(trials))


def stream(store: Store, run: RunResult, *, finish: bool = True) -> str:
    """Write a run the way the loadgen does: begin, each record as it finishes, each trial at its end."""
    run_id = store.begin_run(replace(run.meta, complete=False))
    for t in sorted((t for lv in run.levels for t in lv.trials), key=lambda t: t.order):
        for r in t.records:
            store.add_record(run_id, t.concurrency, t.trial, r)
        store.add_trial(run_id, t)
    if finish:
        store.finish_run(run_id)
    return run_id


def test_streamed_run_loads_back_identical(tmp_path: Path) -> None:
    run = a_run()
    with Store(tmp_path / "t.db") as store:
        run_id = stream(store, run)
        assert run_id == "r1"
        assert store.load_run("r1") == run
    # and from a fresh connection, as another process would see it
    with Store(tmp_path / "t.db") as store:
        back = store.load_run("r1")
    assert back == run
    assert json.dumps(run_to_dict(back)) == json.dumps(run_to_dict(run))


def test_a_run_never_finished_is_incomplete_and_keeps_every_record(tmp_path: Path) -> None:
    run = a_run()
    with Store(tmp_path / "t.db") as store:
        run_id = store.begin_run(run.meta)
        done = run.levels[0].trials[0]
        for r in done.records:
            store.add_record(run_id, 1, 0, r)
        store.add_trial(run_id, done)
        partial = run.levels[1].trials[0].records[:2]
        for r in partial:  # the process dies before this trial ends
            store.add_record(run_id, 2, 0, r)
    with Store(tmp_path / "t.db") as store:
        back = store.load_run(run_id)
        assert [m.complete for m in store.list_runs()] == [False]
    assert back.meta.complete is False
    assert back.level(1) is not None and back.level(1).trials == (done,)  # type: ignore[union-attr]
    [cut] = back.level(2).trials  # type: ignore[union-attr]
    assert cut.records == partial
    assert cut.interrupted is True
    assert cut.start_ns == partial[0].scheduled_ns and cut.end_ns == max(r.end_ns for r in partial)
    assert cut.order > done.order


def test_a_retried_cell_keeps_both_attempts_and_shows_the_last(tmp_path: Path) -> None:
    # The campaign sets a crashed cell aside and re-runs it: same (C, trial), records streamed again.
    first = trial(4, 0, 0, interrupted=True)
    again = trial(4, 0, 1, retry=True)
    other = trial(1, 0, 2)
    with Store(tmp_path / "t.db") as store:
        run_id = store.begin_run(meta())
        for t in (first, again, other):
            for r in t.records:
                store.add_record(run_id, t.concurrency, t.trial, r)
            store.add_trial(run_id, t)
        shown = store.load_run(run_id)
        everything = store.load_run(run_id, superseded=True)
        assert store.counts()[run_id].trials == 3
    assert shown.level(4).trials == (again,)  # type: ignore[union-attr]
    assert everything.level(4).trials == (first, again)  # type: ignore[union-attr]
    assert shown.level(1).trials == everything.level(1).trials == (other,)  # type: ignore[union-attr]


def test_a_retry_cut_short_still_supersedes_the_crashed_attempt(tmp_path: Path) -> None:
    first = trial(4, 0, 0, interrupted=True)
    again = trial(4, 0, 1, retry=True)
    with Store(tmp_path / "t.db") as store:
        run_id = store.begin_run(meta())
        for r in first.records:
            store.add_record(run_id, 4, 0, r)
        store.add_trial(run_id, first)
        store.add_record(run_id, 4, 0, again.records[0])  # killed during the retry
    with Store(tmp_path / "t.db") as store:
        [shown] = store.load_run(run_id).level(4).trials  # type: ignore[union-attr]
    assert shown.records == again.records[:1] and shown.retry and shown.interrupted


def test_records_given_only_with_the_trial_are_stored_once(tmp_path: Path) -> None:
    t = trial(2, 0, 0)
    with Store(tmp_path / "t.db") as store:
        run_id = store.begin_run(meta())
        store.add_record(run_id, 2, 0, t.records[0])  # one streamed, the rest arrive with the trial
        store.add_trial(run_id, t)
        assert store.load_run(run_id).levels[0].trials[0].records == t.records
        assert store.counts()[run_id].requests == len(t.records)


def test_warmup_records_are_kept_but_not_counted(tmp_path: Path) -> None:
    t = trial(1, 0, 0)
    t = replace(t, records=(replace(t.records[0], index=0, warmup=True), *t.records))
    with Store(tmp_path / "t.db") as store:
        run_id = store.begin_run(meta())
        store.add_trial(run_id, t)
        assert store.load_run(run_id).levels[0].trials[0] == t
        assert store.counts()[run_id].requests == len(t.records) - 1


def test_save_run_imports_and_refuses_a_duplicate(tmp_path: Path) -> None:
    run = a_run()
    with Store(tmp_path / "t.db") as store:
        assert store.save_run(run) == "r1"
        assert store.load_run("r1") == run
        with pytest.raises(StoreError, match="run r1 is already in"):
            store.save_run(run)
        assert store.load_run("r1") == run  # the failed import left nothing half-written


def test_an_empty_run_id_gets_a_new_one(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db", clock=lambda: 1_790_000_000.0) as store:
        run_id = store.begin_run(meta(run_id=""))
        assert run_id.startswith("20260921-")
        assert store.load_run(run_id).meta.run_id == run_id


def test_ids_resolve_by_unique_prefix(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db") as store:
        store.begin_run(meta("abc-1"))
        store.begin_run(meta("abd-2"))
        store.begin_run(meta("a_c"))
        assert store.load_run("abc").meta.run_id == "abc-1"
        with pytest.raises(StoreError, match=r"ambiguous.*abc-1, abd-2"):
            store.load_run("ab")
        with pytest.raises(StoreError, match=r"no run 'zz'.*runs ls"):
            store.load_run("zz")
        # LIKE wildcards in an id are literal
        with pytest.raises(StoreError, match="no run 'a%'"):
            store.load_run("a%")
        assert store.resolve("a_") == "a_c"


def test_list_runs_filters_by_label_and_since_newest_first(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db") as store:
        store.begin_run(meta("old", "base", "2026-10-01T00:00:00+00:00"))
        store.begin_run(meta("mid", "spec", "2026-10-15T12:00:00Z"))
        store.begin_run(meta("new", "base", "2026-11-01T09:30:00+00:00"))
        store.finish_run("new")
        assert [m.run_id for m in store.list_runs()] == ["new", "mid", "old"]
        assert [m.run_id for m in store.list_runs(label="base")] == ["new", "old"]
        assert [m.run_id for m in store.list_runs(since="2026-10-15")] == ["new", "mid"]
        assert [m.run_id for m in store.list_runs(label="base", since="2026-10-02")] == ["new"]
        assert {m.run_id: m.complete for m in store.list_runs()} == {"new": True, "mid": False, "old": False}
        assert store.list_runs()[0].server["resolved"] == {"attention_backend": "fa3", "page_size": 64}
        with pytest.raises(ConfigError, match="--since: 'last tuesday' is not a date"):
            store.list_runs(since="last tuesday")


def test_verdicts_are_stored_per_pair(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db", clock=lambda: 1_790_000_000.0) as store:
        store.begin_run(meta("a1"))
        store.begin_run(meta("b1"))
        v = {"concurrency": 4, "verdict": "faster", "delta_pct": 8.1, "ci_low_pct": 5.0, "ci_high_pct": 11.2}
        store.add_verdicts("a1", "b", "agg_tok_s", [v])
        [got] = store.verdicts("a1", "b1")
        extra = {"run_a": "a1", "run_b": "b1", "metric": "agg_tok_s", "created_at": got["created_at"]}
        assert got == {**v, **extra}
        assert got["created_at"].startswith("2026-09-21T")
        assert store.verdicts("b1") == []


def test_writing_to_an_unknown_run_is_a_store_error(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db") as store:
        with pytest.raises(StoreError, match="unknown run 'nope'"):
            store.add_record("nope", 1, 0, record(0, 0))
        with pytest.raises(StoreError, match="unknown run 'nope'"):
            store.add_trial("nope", trial(1, 0, 0))
        with pytest.raises(StoreError, match="finish_run: unknown run 'nope'"):
            store.finish_run("nope")


def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite, just some bytes" * 100)
    with pytest.raises(StoreError, match=r"junk\.db: not a tokbench results store"):
        Store(path)


def test_chunk_arrays_are_stored_packed(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db") as store:
        run_id = store.begin_run(meta())
        store.add_record(run_id, 1, 0, record(0, 10**12))
    conn = sqlite3.connect(tmp_path / "t.db")
    ns, toks = conn.execute("SELECT chunk_ns, chunk_tokens FROM requests").fetchone()
    assert len(ns) == 6 * 8 and len(toks) == 6 * 4


def test_load_run_arg_takes_a_file_or_an_id(tmp_path: Path) -> None:
    from tokbench.report.export import write_result_json

    run = a_run()
    path = tmp_path / "run.json"
    write_result_json(run, path)
    db = tmp_path / "t.db"
    assert load_run_arg(str(path), db) == run  # no store needed for a file
    with Store(db) as store:
        store.save_run(a_run("stored-1"))
    assert load_run_arg("stored", db).meta.run_id == "stored-1"
    with pytest.raises(StoreError, match=r"missing\.json: no such result file"):
        load_run_arg(str(tmp_path / "missing.json"), db)
    with pytest.raises(StoreError, match="neither a result file nor a run id: no results store at"):
        load_run_arg("abc", tmp_path / "none.db")
