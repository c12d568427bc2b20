"""`tokbench sweep` (a subprocess) against `python -m tokbench.testing` (another subprocess): each latency and
per-request figure in the result file equals what the server's own timeline implies, within 2%.

The server's side is computed here from its RequestTrace data, following README.md's "Figures" table, without
calling tokbench.stats: if summary.py breaks a definition (ITL not split per token, per-req tok/s as total /
wall, TPOT over n instead of n - 1 tokens, E2E from the first token, ...) the two views part. Both processes
stamp with perf_counter_ns, one monotonic clock, so their instants compare directly.

Every instant of a figure comes from the server's timeline (first token, each chunk and its token count, end)
except `sent`, which starts TTFT, E2E and Per-req tok/s: only the client sees it. The server's nearest instant
is `accepted_ns` (its handler started), and the gap between the two is real client-side time (opening a
connection, writing the request, the server's loop getting to it): 0.5-4 ms on a reused connection, 8-12 ms
(up to ~35 on a busy machine) for the connections C=16 opens at once on two cores, which put the p50 TTFT
4-12% above the server's view. So TTFT from `accepted_ns` cannot honestly agree within 2%: the 2% check takes
`sent` from the client's record, and a second check holds the server-only view to its tightest principled
bound, the client's figure exceeding it by at most that gap (see `check_server_only_view`). What is left
between the views is the time from the server stamping a chunk to the client reading it: ~0.2-1 ms, now and
then a few ms when either process stalls, small against TTFT ~100 ms (at the p50), decode phases of ~0.6-1.2 s
and per-token gaps of ~20-29 ms (a step; see "speculative" for quarter steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reference_proc import reference_server

from tokbench.testing import RequestTrace, read_jsonl
from tokbench.workload import builtin_corpus

TTFT_MS, ITL_MS = 100, 20
FIGURES = ("per_req_tok_s", "ttft_p50", "e2e_p50", "tpot_p50", "itl_p50")
REL = 0.02  # the done-when


def sweep(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokbench", "sweep", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))  # fmt: skip


def prompt_text(prompt_id: str) -> str:
    """The text the server received for a builtin prompt id (`id~n` is the n-th variant of `id`)."""
    base, _, lap = prompt_id.partition("~")
    prompt = {p.id: p for p in builtin_corpus()}[base]
    return prompt.variant(int(lap)).text if lap else prompt.text


def match(records: Sequence[dict[str, Any]], traces: Sequence[RequestTrace]) -> list[RequestTrace]:
    """The server's trace of each client record: same prompt, the first accepted at or after it was sent."""
    out = []
    for r in records:
        text = prompt_text(r["prompt_id"])
        t = min(
            (t for t in traces if t.prompt == text and t.accepted_ns >= r["sent_ns"]),
            key=lambda t: t.accepted_ns,
            default=None,
        )
        assert t is not None, f"the server has no trace of {r['prompt_id']} sent at {r['sent_ns']}"
        # A sanity bound, not the check: the server took it up soon after it was sent.
        assert t.accepted_ns - r["sent_ns"] < 100_000_000, (r["prompt_id"], t.accepted_ns - r["sent_ns"])
        out.append(t)
    return out


def itl_from_trace(t: RequestTrace) -> np.ndarray:
    """README's ITL from the server's chunks: the gap before a chunk of k tokens is k gaps of gap/k; the
    first chunk's tokens belong to TTFT."""
    values: list[float] = []
    for prev, ns, k in zip(t.chunk_ns, t.chunk_ns[1:], t.chunk_tokens[1:], strict=False):
        values += [(ns - prev) / k] * k
    return np.asarray(values, dtype=float)


def server_figures(served: Sequence[RequestTrace], start_ns: Sequence[int]) -> dict[str, float]:
    """The figures as the server's timeline implies them, each request's TTFT, E2E and rate starting at
    `start_ns` (the client's `sent`, or the server's `accepted_ns`)."""
    assert served and all(t.first_token_ns is not None and t.end_ns is not None for t in served)
    start = np.asarray(start_ns, dtype=float)
    first = np.array([t.first_token_ns for t in served], dtype=float)
    end = np.array([t.end_ns for t in served], dtype=float)
    tokens = np.array([t.completion_tokens for t in served], dtype=float)
    itl_ns = np.concatenate([itl_from_trace(t) for t in served])
    return {
        "per_req_tok_s": float(np.mean(tokens / ((end - start) / 1e9))),
        "ttft_p50": float(np.percentile(first - start, 50)) / 1e6,
        "e2e_p50": float(np.percentile(end - start, 50)) / 1e6,
        "tpot_p50": float(np.percentile((end - first) / (tokens - 1), 50)) / 1e6,
        "itl_p50": float(np.percentile(itl_ns, 50)) / 1e6,
        "itl_mean": float(np.mean(itl_ns)) / 1e6,
    }


def client_figures(trial: dict[str, Any]) -> dict[str, float]:
    """The same figures as the result file (`--out`) reports them."""
    return {
        "per_req_tok_s": trial["per_req_tok_s"],
        "ttft_p50": trial["ttft_ms"]["p50"],
        "e2e_p50": trial["e2e_ms"]["p50"],
        "tpot_p50": trial["tpot_ms"]["p50"],
        "itl_p50": trial["itl_ms"]["p50"],
        "itl_mean": trial["itl_ms"]["mean"],
    }


def deviation(name: str, client: float, server: float, extra: str = "") -> str:
    return f"{name}: client {client:.5g} server {server:.5g} ({client / server - 1:+.2%}){extra}"


def check_server_only_view(
    client: dict[str, float], served: Sequence[RequestTrace], sent_ns: Sequence[int]
) -> tuple[list[str], list[str]]:
    """The figures from the server's timeline alone (`accepted_ns` for `sent`) against the client's, with the
    tightest honest bound: the client's TTFT and E2E are the server's plus the unseen sent -> accepted gap d
    (0 <= d <= max d for every request, so no order statistic, p50 included, moves by more), plus the
    chunk-read delay the 2% covers; Per-req tok/s moves down by at most max d / min E2E on top of the 2%.
    Returns (report lines, failures)."""
    accepted = [t.accepted_ns for t in served]
    gap_ms = max((a - s) / 1e6 for a, s in zip(accepted, sent_ns, strict=True))
    srv = server_figures(served, accepted)
    shortest_ms = min((t.end_ns or 0) - t.accepted_ns for t in served) / 1e6
    bounds = {
        "ttft_p50": (srv["ttft_p50"] * (1 - REL), srv["ttft_p50"] * (1 + REL) + gap_ms),
        "e2e_p50": (srv["e2e_p50"] * (1 - REL), srv["e2e_p50"] * (1 + REL) + gap_ms),
        "per_req_tok_s": (
            srv["per_req_tok_s"] * (1 - REL - gap_ms / shortest_ms),
            srv["per_req_tok_s"] * (1 + REL),
        ),
    }
    report, failed = [], []
    for name, (lo, hi) in bounds.items():
        extra = f" in [{lo:.5g}, {hi:.5g}], max sent->accepted {gap_ms:.3g} ms"
        report.append(deviation(f"{name} (server-only)", client[name], srv[name], extra))
        if not lo <= client[name] <= hi:
            failed.append(report[-1])
    return report, failed


# The client learns each chunk's token count from per-chunk usage, as with vLLM's continuous_usage_stats
# (without it the counts are estimated from the final usage, which is README's rule but not the truth).
CONTINUOUS_USAGE = json.dumps({"stream_options": {"continuous_usage_stats": True}})
# name: (max tokens, server flags, sweep flags, figures checked within 2%)
CASES: dict[str, tuple[int, list[str], list[str], tuple[str, ...]]] = {
    # One token per chunk; the batching model makes every figure move with C. 40 tokens: TPOT's (tokens - 1)
    # is 2.5% away from tokens, so an off-by-one there is caught too.
    "plain": (40, [], ["-c", "1,4,16"], FIGURES),
    # Chunks of 4 tokens sent every 4th step (the first token alone, the last 3 together): the ITL p50 is one
    # step only if the gap before a k-token chunk is divided by k (else 4 steps). --warmup 0 here and below
    # only saves time.
    "chunked": (
        28,
        ["--tokens-per-chunk", "4"],
        ["-c", "4", "--requests", "12", "--warmup", "0", "--extra-body", CONTINUOUS_USAGE],
        FIGURES,
    ),
    # Speculative decoding: each step's chunk carries 1 token (p 0.65) or 4 (first draft accepted, then all;
    # fewer at the max-tokens cap), so per-token gaps are a step or a quarter of one by chunk size and the ITL
    # weighting moves the mean: ~step/2 when each of a chunk's k tokens counts, ~0.74 step with one value per
    # chunk, ~step with undivided gaps. The mean, not the p50, because only the mean survives client stalls
    # here: when the client stalls past a step, two chunks land in one read and count as one chunk (README's
    # same-instant rule), so a 1-token and a 4-token chunk become five values of 0.4 step, lifting four values
    # from below the p50 (quarter steps) to above it. Measured under CPU contention: p50 7-8% above the
    # server's. The mean is untouched (a request's per-token gaps sum to its last chunk minus its first), and
    # with equal per-token gaps (the cases above) a merge changes no value. 64 tokens (~31 steps) keep the
    # decode phase long against such stalls for TPOT and E2E.
    "speculative": (
        64,
        ["--spec-accept", "0.35,1,1"],
        ["-c", "4", "--requests", "12", "--warmup", "0", "--extra-body", CONTINUOUS_USAGE],
        ("per_req_tok_s", "ttft_p50", "e2e_p50", "tpot_p50", "itl_mean"),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_figures_agree_with_the_servers_timeline(tmp_path: Path, case: str) -> None:
    max_tokens, server_args, sweep_args, figures = CASES[case]
    out = tmp_path / "run.json"
    timing = ["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]
    with reference_server(tmp_path, *timing, *server_args) as (url, timeline):
        p = sweep("--base-url", url, "--max-tokens", str(max_tokens), "--out", str(out), "--no-store",
                  "--metrics-url", "none", *sweep_args)  # fmt: skip
    assert p.returncode == 0, p.stderr
    result = json.loads(out.read_text())
    traces = read_jsonl(timeline)

    levels = sweep_args[sweep_args.index("-c") + 1]
    assert [lv["concurrency"] for lv in result["levels"]] == [int(c) for c in levels.split(",")]
    report, failed = [], []
    for lv in result["levels"]:
        c = lv["concurrency"]
        (trial,) = lv["trials"]
        measured = [r for r in trial["records"] if not r["warmup"]]
        assert trial["ok"] == len(measured) and trial["errors"] == {}
        served = match(measured, traces)
        assert len({t.id for t in served}) == len(served)  # one trace per record
        assert all(t.ok and t.completion_tokens == max_tokens for t in served)
        assert [r["completion_tokens"] for r in measured] == [t.completion_tokens for t in served]
        if case != "plain":  # chunks really carried several tokens, and the client saw how many
            assert max(k for t in served for k in t.chunk_tokens) == 4
            assert [r["chunk_tokens"] for r in measured] == [t.chunk_tokens for t in served]
        sent = [r["sent_ns"] for r in measured]
        server, client = server_figures(served, sent), client_figures(trial)
        for name in figures:
            report.append(f"C={c} " + deviation(name, client[name], server[name]))
            if client[name] != pytest.approx(server[name], rel=REL):
                failed.append(report[-1])
        only_report, only_failed = check_server_only_view(client, served, sent)
        report += [f"C={c} {line}" for line in only_report]
        failed += [f"C={c} {line}" for line in only_failed]
    print("\n".join(report))  # shown with -s: the measured deviations
    assert not failed, "\n".join(["off:", *failed, "all:", *report])
