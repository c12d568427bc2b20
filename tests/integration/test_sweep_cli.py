"""`tokbench sweep` as a user runs it: a subprocess against `python -m tokbench.testing` (another subprocess),
checked against the server's own timeline; Ctrl-C; and flag errors that name the flag."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from reference_proc import reference_server

from tokbench.cli import main
from tokbench.errors import ConfigError
from tokbench.records import RequestRecord
from tokbench.testing import RequestTrace, read_jsonl
from tokbench.workload import builtin_corpus

SECRET = "sk-tokbench-test-SECRET-42"


def sweep(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokbench", "sweep", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


def table_column(stdout: str, name: str) -> dict[int, str]:
    """{C: cell} for one column of the seed table (right-aligned under its header)."""
    lines = stdout.splitlines()
    header = next(line for line in lines if f" {name} " in f" {line} " and "Agg tok/s" in line)
    end = header.index(f" {name}") + 1 + len(name)
    out = {}
    for line in lines[lines.index(header) + 1 :]:
        parts = line.split()
        if parts and parts[0].isdigit():
            out[int(parts[0])] = line[:end].split()[-1]
    return out


def test_sweep_prints_the_seed_table_and_agrees_with_the_server(tmp_path: Path) -> None:
    out, db = tmp_path / "run.json", tmp_path / "tb.db"
    with reference_server(tmp_path, "--ttft-ms", "5", "--itl-ms", "2") as (url, timeline):
        args = ["--base-url", url, "-c", "1,4,16,32", "--max-tokens", "200", "--out", str(out), "--db", db,
                "--label", "cli-test", "--api-key-env", "TB_TEST_KEY"]  # fmt: skip
        p = sweep(*map(str, args), env={"TB_TEST_KEY": SECRET})
    assert p.returncode == 0, p.stderr
    ok = table_column(p.stdout, "Ok")
    assert ok == {1: "4", 4: "8", 16: "32", 32: "64"}  # Ok == requests at every level
    assert "cli-test" in p.stdout

    result = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 4, 16, 32]
    corpus = {p.id: p.text for p in builtin_corpus()}
    traces = {t.prompt: t for t in read_jsonl(timeline)}
    for lv in result["levels"]:
        (trial,) = lv["trials"]
        for key in ("agg_tok_s", "per_req_tok_s", "tokens", "wall_s", "ok", "errors"):
            assert key in trial
        n = max(4, 2 * lv["concurrency"])
        assert trial["ok"] == n and trial["errors"] == {} and trial["tokens"] == 200 * n
        measured = [r for r in trial["records"] if not r["warmup"]]
        served = [traces[corpus[r["prompt_id"]]] for r in measured]
        assert all(t.ok and t.completion_tokens == 200 for t in served)
        # The server's own timeline (same monotonic clock, another process) implies the same throughput. The
        # client's wall also holds opening new connections, which the server cannot see: long requests keep
        # that under the 2% of the done-when even on a busy machine.
        server_wall_s = (max(t.end_ns or 0 for t in served) - min(t.accepted_ns for t in served)) / 1e9
        assert trial["agg_tok_s"] == pytest.approx(trial["tokens"] / server_wall_s, rel=0.02)

    assert SECRET not in out.read_text() and SECRET not in p.stdout + p.stderr
    assert SECRET.encode() not in db.read_bytes()
    assert result["meta"]["load"]["api_key_env"] == "TB_TEST_KEY"
    from tokbench.store import Store

    with Store(db) as store:
        (meta,) = store.list_runs()
        assert meta.complete and meta.label == "cli-test"
        stored = store.load_run(meta.run_id)
    assert [len(lv.trials[0].measured) for lv in stored.levels] == [4, 8, 32, 64]


def test_ctrl_c_keeps_finished_records_and_exits_130(tmp_path: Path) -> None:
    out, db = tmp_path / "run.json", tmp_path / "tb.db"
    with reference_server(tmp_path, "--ttft-ms", "2", "--itl-ms", "20") as (url, _):
        args = ["--base-url", url, "-c", "2", "--requests", "200", "--max-tokens", "10", "--warmup", "0",
                "--out", str(out), "--db", str(db), "--metrics-url", "none"]  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", "tokbench", "sweep", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        from tokbench.store import Store

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until some records are durable
            time.sleep(0.3)
            if db.exists():
                with Store(db) as store:
                    runs = store.list_runs()
                    if runs and len(store.load_run(runs[0].run_id).levels) > 0:
                        break
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    result = json.loads(out.read_text())
    assert result["meta"]["complete"] is False
    (trial,) = result["levels"][0]["trials"]
    assert trial["interrupted"] is True
    kinds = [r["error_kind"] for r in trial["records"]]
    assert kinds.count("cancelled") == 2 and kinds.count(None) >= 2
    with Store(db) as store:
        (meta,) = store.list_runs()
        assert not meta.complete
        stored = store.load_run(meta.run_id)
    assert len(stored.levels[0].trials[0].records) == len(trial["records"])
    assert table_column(stdout, "Ok") == {2: str(kinds.count(None))}


def served_whole(t: RequestTrace, r: RequestRecord, slack_ns: int = 20_000_000) -> bool:
    """The server's trace `t` is the request the client recorded as `r`: accepted after it was sent, its first
    token within `slack_ns` of the client's (the server stamps a chunk after its write returns, so the client
    may read it first), its last token sent before the client's end (give or take that slack)."""
    return (
        r.sent_ns <= t.accepted_ns
        and r.first_token_ns is not None
        and t.first_token_ns is not None
        and abs(t.first_token_ns - r.first_token_ns) <= slack_ns
        and t.chunk_ns[-1] <= r.end_ns + slack_ns
    )


def test_sigkill_mid_level_keeps_every_finished_request_in_the_store(tmp_path: Path) -> None:
    """The real sweep, killed with SIGKILL (no handler runs): each request it had finished is in the store,
    each stored record is a request the server really served whole, and the run stays incomplete."""
    db = tmp_path / "tb.db"
    from tokbench.store import Store

    with reference_server(tmp_path, "--ttft-ms", "2", "--itl-ms", "15") as (url, timeline):
        args = ["--base-url", url, "-c", "1,4", "--requests", "400", "--max-tokens", "10", "--warmup", "0",
                "--db", str(db), "--metrics-url", "none"]  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", "tokbench", "sweep", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        durable = 0
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and durable < 12:  # partway into the first level's 400
                time.sleep(0.2)
                if db.exists():
                    with Store(db) as store:
                        durable = sum(c.requests for c in store.counts().values())
            os.kill(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL, stderr
    assert durable >= 12, "the sweep never made a request durable"

    with Store(db) as store:
        (meta,) = store.list_runs()
        run = store.load_run(meta.run_id)
    assert not meta.complete and not run.meta.complete
    (level,) = run.levels
    (trial,) = level.trials
    assert level.concurrency == 1 and trial.interrupted  # the trial in progress comes back marked
    records = trial.records
    assert len(records) >= durable and len(records) < 400
    served = [t for t in read_jsonl(timeline) if t.end_ns is not None and t.completion_tokens == 10]
    for r in records:
        assert r.ok and r.output_tokens == 10 and sum(r.chunk_tokens) == 10
        assert r.first_token_ns is not None
        # the server served this very request whole (one monotonic clock across the two processes)
        assert any(served_whole(t, r) for t in served), r
    assert len({r.sent_ns for r in records}) == len(records)  # no duplicate


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["-c", "1,x"], {}, "-c/--concurrency"),
        (["--requests", "0"], {}, "--requests"),
        (["--trials", "0"], {}, "--trials"),
        (["--top-p", "2"], {}, "--top-p"),
        (["--timeout", "0"], {}, "--timeout"),
        (["--extra-body", "[1]"], {}, "--extra-body"),
        (["--extra-body", "{bad"], {}, "--extra-body"),
        (["--api-key-env", "TB_UNSET_VAR_X"], {}, "--api-key-env"),
        (["--prompts", "/nonexistent/prompts.jsonl"], {}, "--prompts"),
    ],
)
def test_bad_flags_name_the_flag(args: list[str], env: dict[str, str], needle: str) -> None:
    result = CliRunner().invoke(
        main, ["sweep", "--base-url", "http://127.0.0.1:9", "--no-store", *args], env=env
    )
    assert result.exit_code == ConfigError.exit_code, result.output
    assert f"error: {needle}" in result.output


def test_unreachable_server_names_model_flag(tmp_path: Path) -> None:
    p = sweep("--base-url", "http://127.0.0.1:9", "--no-store", "-c", "1", timeout=60)
    assert p.returncode == ConfigError.exit_code
    assert "error: --model:" in p.stderr and "pass --model NAME" in p.stderr
