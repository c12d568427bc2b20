"""A process writing a run through Store, killed with SIGKILL mid-level, loses no finished request, and the
run stays marked incomplete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tokbench.store import Store

# The child writes records as the loadgen does (begin_run, add_record per finished request, add_trial at each
# trial's end) and prints how many add_record calls have returned; "finished" means add_record returned.
CHILD = r"""
import sys
from tokbench.records import RequestRecord, RunMeta, TrialResult
from tokbench.store import Store

PER_TRIAL = 40
store = Store(sys.argv[1])
run_id = store.begin_run(RunMeta("killed", "kill-test", "0.1.0", "2026-11-01T00:00:00+00:00"))
print("begun", flush=True)
n = 0
while True:
    c, trial = 2 ** ((n // PER_TRIAL) % 4), n // (PER_TRIAL * 4)
    t0 = 10**12 + n * 10**7
    rec = RequestRecord(
        index=n % PER_TRIAL, prompt_id=f"p{n}", scheduled_ns=t0, sent_ns=t0 + 1, end_ns=t0 + 5 * 10**6,
        first_token_ns=t0 + 10**6, chunk_ns=tuple(t0 + 10**6 + k * 10**4 for k in range(200)),
        chunk_tokens=(1,) * 200, output_text="tok " * 200, completion_tokens=200, http_status=200,
    )
    store.add_record(run_id, c, trial, rec)
    n += 1
    print(n, flush=True)
    if n % PER_TRIAL == 0:
        start = t0 - (PER_TRIAL - 1) * 10**7
        store.add_trial(run_id, TrialResult(c, trial, n // PER_TRIAL - 1, 1.7e9, start, t0 + 5 * 10**6))
"""


def test_sigkill_mid_level_loses_no_finished_request(tmp_path: Path) -> None:
    db = tmp_path / "kill.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    finished = 0
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "begun"
        deadline = time.monotonic() + 60
        # Kill partway into a trial (not on a trial boundary) once a few trials are closed.
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            finished = int(line)
            if finished >= 250:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    assert finished >= 250, "the writer was too slow to reach the middle of a level"

    with Store(db) as store:
        [meta] = store.list_runs()
        run = store.load_run("killed")
        counts = store.counts()["killed"]
    assert meta.complete is False and run.meta.complete is False
    records = [r for lv in run.levels for t in lv.trials for r in t.records]
    assert len(records) == counts.requests >= finished
    assert sorted(int(r.prompt_id[1:]) for r in records) == list(range(len(records)))  # no gap, no duplicate
    assert all(len(r.chunk_ns) == 200 and r.output_tokens == 200 for r in records)
    closed = [t for lv in run.levels for t in lv.trials if not t.interrupted]
    cut = [t for lv in run.levels for t in lv.trials if t.interrupted]
    assert len(closed) >= 250 // 40
    assert all(len(t.records) == 40 for t in closed)
    # The trial in progress when the process died comes back interrupted, holding what finished.
    assert len(cut) <= 1 and sum(len(t.records) for t in cut) == len(records) - 40 * len(closed)
