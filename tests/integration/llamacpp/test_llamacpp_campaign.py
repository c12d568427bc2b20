"""Campaigns against the real llama-server: A/A gives no verdict, bad flags are caught before or at launch,
and a server killed with SIGKILL mid-level is restarted once with only its cell re-run."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from llama_helpers import llama_argv, tokbench

from tokbench.campaign import run_campaign
from tokbench.config import Plan, plan_from_dict
from tokbench.server.diagnose import Triage
from tokbench.server.engines import http_get
from tokbench.server.install import EnginePaths

pytestmark = pytest.mark.llamacpp


def plan(configs: list[dict[str, Any]], **sweep: Any) -> Plan:
    trials = sweep.pop("trials", 1)
    return plan_from_dict(
        {"configs": configs, "sweep": {"warmup": 1, "timeout_s": 120.0, **sweep}, "trials": trials}, "test"
    )


def config(engine: EnginePaths, name: str, *extra: str, baseline: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "engine": "llamacpp",
        "argv": llama_argv(engine, *extra),
        "baseline": baseline,
        "ready_timeout_s": 120,
    }


def test_a_a_campaign_gives_no_faster_or_slower(llama_engine: EnginePaths, tmp_path: Path) -> None:
    # Two identical configurations, interleaved with restarts (A B, B A, A B): whatever differs is noise.
    p = plan(
        [config(llama_engine, "a", baseline=True), config(llama_engine, "b")],
        concurrencies=[1, 4],
        requests=4,
        max_tokens=48,
        trials=3,
    )
    result = run_campaign(p, tmp_path / "aa")
    assert not result.failures
    verdicts = result.verdicts["b"]
    assert [v.concurrency for v in verdicts] == [1, 4]
    assert {v.verdict for v in verdicts} <= {"no_difference", "inconclusive"}, [
        (v.concurrency, v.verdict, v.delta_pct, v.ci_low_pct, v.ci_high_pct) for v in verdicts
    ]
    for run in result.runs.values():
        for level in run.levels:
            assert len(level.trials) == 3
            assert all(r.ok for t in level.trials for r in t.measured)

    # `tokbench compare` on the written result files reaches the same verdicts
    results = tmp_path / "aa" / "results"
    done = tokbench("compare", str(results / "a.json"), str(results / "b.json"), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["concurrency"], r["verdict"]) for r in rows] == [(v.concurrency, v.verdict) for v in verdicts]
    assert (tmp_path / "aa" / "checklist.md").read_text().strip()


def test_draft_model_without_spec_type_is_flagged_and_diagnosed(
    llama_engine: EnginePaths, tmp_path: Path
) -> None:
    # llama-server loads the draft and never speculates, silently (issue #25345): preflight warns before
    # launch, and the accounting then shows that no draft ever ran.
    p = plan(
        [
            config(llama_engine, "base", baseline=True),
            config(llama_engine, "draft", "-md", str(llama_engine.model)),
        ],
        concurrencies=[1],
        requests=2,
        max_tokens=24,
        trials=2,
    )
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(p.model_dump(mode="json")))
    done = tokbench("campaign", "check", str(plan_file))
    assert done.returncode == 0, done.stderr
    assert "-md without --spec-type" in done.stdout and "--spec-type draft-simple" in done.stdout

    result = run_campaign(p, tmp_path / "md")
    assert [w.rule.id for w in result.warnings] == ["llamacpp-draft-without-spec-type"]
    (draft,) = [o for o in result.outcomes if o.name == "draft"]
    assert draft.spec_levels, draft.spec_error
    (level,) = draft.spec_levels
    assert level.checks[0] == "not_engaged", [f.message for f in level.findings]
    assert "-md without --spec-type" in level.findings[0].message


def test_unknown_argument_is_named_by_triage(llama_engine: EnginePaths, tmp_path: Path) -> None:
    p = plan(
        [
            config(llama_engine, "base", baseline=True),
            config(llama_engine, "typo", "--spec-typo", "ngram-simple"),
        ],
        concurrencies=[1],
        requests=2,
        max_tokens=16,
    )
    result = run_campaign(p, tmp_path / "typo")
    failure = result.failures["typo"]
    assert isinstance(failure, Triage)
    # llama-server's own message, verbatim
    assert failure.root_cause is not None and "invalid argument: --spec-typo" in failure.root_cause
    assert failure.exit_code not in (None, 0)
    # the campaign went on with the baseline
    assert "base" in result.runs and "typo" not in result.runs
    assert "typo" in (tmp_path / "typo" / "checklist.md").read_text()


def _pid_listening_on(port: int) -> int | None:
    needle = f"--port\0{port}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    return None


def test_sigkill_mid_level_restarts_once_and_reruns_only_that_cell(
    llama_engine: EnginePaths, tmp_path: Path
) -> None:
    p = plan(
        [config(llama_engine, "solo", baseline=True)],
        concurrencies=[1, 2],
        requests=2,
        max_tokens=96,
        warmup=0,
    )
    killed: list[int] = []
    urls: list[str] = []
    ready = threading.Event()

    def on_event(text: str) -> None:
        m = re.search(r"ready after .* at (http://\S+)", text)
        if m:
            urls.append(m.group(1))
            ready.set()

    def killer() -> None:
        # Wait for the first launch's first measured request to be decoding, then SIGKILL the server.
        if not ready.wait(180):
            return
        url = urls[0]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status, body = http_get(url + "/metrics", 2.0)
            m = re.search(rb"^llamacpp:n_decode_total (\d+)", body, re.M) if status == 200 else None
            if m and int(m.group(1)) >= 10:
                pid = _pid_listening_on(int(url.rsplit(":", 1)[1]))
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = run_campaign(p, tmp_path / "kill", on_event=on_event)
    thread.join(10)
    assert killed, "the server was never killed"

    assert not result.failures, "the crash was recovered, so it is not a failure of the configuration"
    run = result.runs["solo"]
    by_cell = {(lv.concurrency, t.trial): t for lv in run.levels for t in lv.trials}
    assert sorted(by_cell) == [(1, 0), (2, 0)]
    assert by_cell[(1, 0)].retry, "the spoiled cell was re-run, as a retry"
    assert not by_cell[(2, 0)].retry, "only the spoiled cell was re-run"
    for t in by_cell.values():
        assert len(t.measured) == 2 and all(r.ok for r in t.measured)
    (outcome,) = result.outcomes
    crashes = [f for f in outcome.failures if f.kind == "crash"]
    assert len(crashes) == 1 and crashes[0].recovered and crashes[0].cell == (1, 0)
    logs = sorted(x.name for x in (tmp_path / "kill" / "logs").iterdir())
    assert logs == ["solo-1.log", "solo-2.log"], "exactly one restart"
    # the spoiled attempt is kept as data, apart from the figures
    assert (tmp_path / "kill" / "results" / "solo.failed-attempts.json").is_file()
