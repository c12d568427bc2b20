"""Result files (stable keys, round trip, atomic write, errors naming file and field); vLLM, CSV exports."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from report_runs import MS, make_request, make_run, make_trial

from tokbench.errors import StoreError
from tokbench.records import RunMeta, RunResult, TrialResult, group_trials
from tokbench.report import export
from tokbench.report.export import (
    export_run,
    read_result_json,
    result_to_json,
    to_csv,
    to_vllm_bench_json,
    write_result_json,
)
from tokbench.stats.summary import METRICS


def test_stable_keys_hold_the_seed_figures_computed_from_records() -> None:
    run = make_run("a", levels=(1, 4), trials=2)
    d = result_to_json(run)
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 4]
    for lv_dict, lv in zip(d["levels"], run.levels, strict=True):
        assert len(lv_dict["trials"]) == 2
        for t_dict, t in zip(lv_dict["trials"], lv.trials, strict=True):
            tokens = sum(r.completion_tokens or 0 for r in t.records)
            wall = (max(r.end_ns for r in t.records) - min(r.scheduled_ns for r in t.records)) / 1e9
            assert t_dict["tokens"] == tokens
            assert t_dict["wall_s"] == pytest.approx(wall)
            assert t_dict["agg_tok_s"] == pytest.approx(tokens / wall)
            per_req = [r.output_tokens / ((r.end_ns - r.sent_ns) / 1e9) for r in t.records]
            assert t_dict["per_req_tok_s"] == pytest.approx(sum(per_req) / len(per_req))
            assert t_dict["ok"] == len(t.records)
            assert t_dict["errors"] == {}
            assert len(t_dict["records"]) == len(t.records)
        summary = lv_dict["summary"]["agg_tok_s"]
        assert summary["n_trials"] == 2
        assert summary["mean"] == pytest.approx(sum(t["agg_tok_s"] for t in lv_dict["trials"]) / 2)
        # every figure compare judges has its summary, the mean of the trials' own values
        assert set(lv_dict["summary"]) == set(METRICS)
        ttft = lv_dict["summary"]["ttft_p50"]
        assert ttft["mean"] == pytest.approx(sum(t["ttft_ms"]["p50"] for t in lv_dict["trials"]) / 2)
        assert ttft["ci_low"] <= ttft["mean"] <= ttft["ci_high"]
    json.dumps(d, allow_nan=False)  # plain JSON: no NaN, no numpy types


def test_errors_are_counted_by_kind_and_a_trial_without_ok_requests_writes_null() -> None:
    t = make_trial(2, 0, 0, errors=3)
    failed_only = replace(t, records=t.records[-3:])
    run = RunResult(make_run("x").meta, group_trials([t]))
    trial = result_to_json(run)["levels"][0]["trials"][0]
    assert trial["errors"] == {"http_status": 3}
    assert trial["ok"] == 4
    only = result_to_json(RunResult(run.meta, group_trials([failed_only])))["levels"][0]["trials"][0]
    assert only["ok"] == 0 and only["per_req_tok_s"] is None and only["tokens"] == 0


def test_round_trip_gives_back_the_measured_run(tmp_path: Path) -> None:
    run = make_run("a", levels=(1, 2), trials=2)
    path = tmp_path / "sub" / "run.json"
    write_result_json(run, path)
    assert read_result_json(path) == run
    assert not [p for p in path.parent.iterdir() if p.name != "run.json"]  # no temporary left behind


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.json"
    old = make_run("old", levels=(1,), trials=1)
    write_result_json(old, path)
    before = path.read_bytes()

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(StoreError, match=r"run\.json: cannot write \(No space left on device\)"):
        write_result_json(make_run("new"), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"bad\.json: not JSON \(line 1 column 2"),
        ("[1, 2]", r"bad\.json: expected a JSON object"),
        ('{"meta": {}, "levels": []}', r"bad\.json: missing key 'schema_version'"),
        ('{"schema_version": 99, "meta": {}, "levels": []}', r"schema_version 99 is newer than this"),
        ('{"schema_version": 1, "meta": {}}', r"bad\.json: missing key 'levels'"),
        ('{"schema_version": 1, "meta": {}, "levels": {}}', r"bad\.json: levels: expected a list"),
    ],
)
def test_a_bad_file_names_itself_and_the_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(StoreError, match=message):
        read_result_json(path)


def test_a_bad_record_field_is_named_with_its_position(tmp_path: Path) -> None:
    d = result_to_json(make_run("a", levels=(1,), trials=1))
    d["levels"][0]["trials"][0]["records"][1]["error_kind"] = "gremlins"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(d))
    with pytest.raises(StoreError, match=r"r\.json\.levels\[0\]\.trials\[0\]\.records\[1\]\.error_kind"):
        read_result_json(path)


def test_missing_file_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such result file"):
        read_result_json(tmp_path / "nope.json")


def test_vllm_export_uses_vllm_names_and_definitions() -> None:
    # Chunks of 4 tokens: vLLM's ITL is per chunk (4x tokbench's per-token ITL).
    t0 = 10**12
    recs = tuple(make_request(i, t0 + i * MS, 40.0, 10.0, tokens=40, per_chunk=4) for i in range(3))
    t = TrialResult(3, 0, 0, 1_780_000_000.0, t0, max(r.end_ns for r in recs), recs)
    run = RunResult(make_run("v").meta, group_trials([t]))
    [v] = to_vllm_bench_json(run)
    fig = result_to_json(run)["levels"][0]["trials"][0]
    assert v["max_concurrency"] == 3
    assert v["completed"] == 3 and v["failed"] == 0 and v["num_prompts"] == 3
    assert v["total_output_tokens"] == 120 and v["total_input_tokens"] == 60
    assert v["output_throughput"] == pytest.approx(fig["agg_tok_s"])
    assert v["duration"] == pytest.approx(fig["wall_s"])
    assert v["request_throughput"] == pytest.approx(3 / fig["wall_s"])
    assert v["mean_ttft_ms"] == pytest.approx(40.0) and v["p99_ttft_ms"] == pytest.approx(40.0)
    assert v["ttfts"] == pytest.approx([0.04] * 3)
    assert v["mean_itl_ms"] == pytest.approx(40.0)  # one gap per 4-token chunk
    assert all(len(gaps) == 9 for gaps in v["itls"])  # 10 chunks -> 9 gaps
    # TPOT = (E2EL - TTFT) / (output_len - 1): 9 chunk gaps of 40 ms + 1 ms to the end, over 39 tokens
    assert v["median_tpot_ms"] == pytest.approx((9 * 40.0 + 1.0) / 39)
    assert v["output_lens"] == [40, 40, 40] and v["input_lens"] == [20, 20, 20]
    assert v["errors"] == ["", "", ""]
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            assert f"{stat}_{name}_ms" in v


def test_vllm_export_writes_one_object_per_trial_and_failures_as_vllm_does(tmp_path: Path) -> None:
    t = make_trial(2, 0, 0, errors=2)
    run = RunResult(make_run("v").meta, group_trials([t, make_trial(4, 0, 1)]))
    path = tmp_path / "out.jsonl"
    export_run(run, "vllm", path)
    objs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [o["max_concurrency"] for o in objs] == [2, 4]
    first = objs[0]
    assert first["completed"] == 4 and first["failed"] == 2
    assert first["errors"][-2:] == ["http_status: HTTP 500: boom"] * 2
    assert first["output_lens"][-2:] == [0, 0] and first["ttfts"][-2:] == [0.0, 0.0]


def test_csv_has_one_row_per_measured_request_and_per_trial() -> None:
    t = make_trial(2, 0, 0, errors=1)
    warm = replace(t.records[0], index=99, warmup=True)
    run = RunResult(make_run("c").meta, group_trials([replace(t, records=(*t.records, warm))]))
    rows = list(csv.DictReader(io.StringIO(to_csv(run))))
    assert len(rows) == len(t.records)  # the warmup record is left out
    assert tuple(rows[0]) == export.REQUEST_COLUMNS
    err = rows[-1]
    assert err["ok"] == "0" and err["error_kind"] == "http_status" and err["ttft_ms"] == ""
    assert float(rows[0]["ttft_ms"]) == pytest.approx(30.0)
    trials = list(csv.DictReader(io.StringIO(to_csv(run, "trial"))))
    assert len(trials) == 1 and trials[0]["errors"] == "1" and trials[0]["ok"] == "4"
    figures = result_to_json(run)["levels"][0]["trials"][0]
    assert float(trials[0]["agg_tok_s"]) == pytest.approx(figures["agg_tok_s"])


def test_recorded_fields_win_over_figures_of_the_same_name() -> None:
    # TrialFigures has its own `interrupted`/`imported`; the file must keep what was recorded.
    t = make_trial(1, 0, 0)
    t = replace(t, interrupted=True)
    run = RunResult(RunMeta("r", "", "0.1.0", "2026-11-01T00:00:00Z"), group_trials([t]))
    trial = result_to_json(run)["levels"][0]["trials"][0]
    assert trial["interrupted"] is True and trial["imported"] is None
