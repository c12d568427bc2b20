"""Synthetic runs for the report tests: records built from a seeded RNG with known timing, so figures are
computable by hand (tokens / wall) and renders are reproducible."""

from __future__ import annotations

import numpy as np

from tokbench.records import ErrorKind, RequestRecord, RunMeta, RunResult, TrialResult, group_trials

MS = 1_000_000


def make_request(
    index: int, start_ns: int, ttft_ms: float, itl_ms: float, tokens: int, *, per_chunk: int = 1
) -> RequestRecord:
    first = start_ns + int(ttft_ms * MS)
    n_chunks = max(1, tokens // per_chunk)
    chunk_ns = tuple(first + int(i * itl_ms * per_chunk * MS) for i in range(n_chunks))
    return RequestRecord(
        index=index,
        prompt_id=f"p{index}",
        scheduled_ns=start_ns,
        sent_ns=start_ns,
        end_ns=chunk_ns[-1] + MS,
        first_token_ns=first,
        chunk_ns=chunk_ns,
        chunk_tokens=(per_chunk,) * n_chunks,
        output_text="x" * tokens,
        prompt_tokens=20,
        completion_tokens=tokens,
        finish_reason="length",
        http_status=200,
    )


def make_trial(
    concurrency: int,
    trial: int,
    order: int,
    *,
    speed: float = 1.0,
    tokens: int = 50,
    errors: int = 0,
    seed: int = 0,
) -> TrialResult:
    """`concurrency` slots, two requests each back to back; ITL grows with concurrency (a batching engine)."""
    rng = np.random.default_rng(seed)
    t0 = 10**12 + order * 10**10
    itl = (10.0 + 0.5 * concurrency) / speed * float(rng.uniform(0.97, 1.03))
    records = []
    idx = 0
    for slot in range(concurrency):
        start = t0 + slot * MS
        for _ in range(2):
            r = make_request(idx, start, ttft_ms=30.0 + slot, itl_ms=itl, tokens=tokens)
            records.append(r)
            start = r.end_ns
            idx += 1
    for e in range(errors):
        records.append(
            RequestRecord(
                index=idx + e, prompt_id=f"e{e}", scheduled_ns=t0, sent_ns=t0, end_ns=t0 + 5 * MS,
                http_status=500, error_kind=ErrorKind.HTTP_STATUS, error_message="HTTP 500: boom",
            )
        )  # fmt: skip
    return TrialResult(
        concurrency=concurrency,
        trial=trial,
        order=order,
        started_at=1_780_000_000.0 + order,
        start_ns=t0,
        end_ns=max(r.end_ns for r in records),
        records=tuple(records),
        achieved_concurrency=float(concurrency),
        loop_lag_p99_ms=0.4,
    )


def make_run(
    label: str,
    *,
    levels: tuple[int, ...] = (1, 2, 4),
    trials: int = 3,
    speed: float = 1.0,
    seed: int = 0,
    server: dict[str, object] | None = None,
) -> RunResult:
    out = []
    order = 0
    for k in range(trials):
        for c in levels:
            out.append(make_trial(c, k, order, speed=speed, seed=seed * 1000 + order))
            order += 1
    meta = RunMeta(
        run_id=f"run-{label}",
        label=label,
        tool_version="0.1.0",
        started_at="2026-11-01T10:00:00+00:00",
        base_url="http://127.0.0.1:8080",
        model="gemma-3-270m",
        load={"concurrencies": list(levels), "trials": trials, "max_tokens": 50},
        server=server if server is not None else {"engine": "llamacpp", "argv": ["llama-server"]},
        environment={"host": "box", "cpu": "2 cores", "python": "3.11.7"},
    )
    return RunResult(meta, group_trials(out))


def vllm_scrape(drafts: int, draft_tokens: int, accepted: int, per_pos: tuple[int, ...], tokens: int) -> str:
    """A vLLM /metrics body with the speculative counters at these values."""
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter",
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}',
        "# TYPE vllm:spec_decode_num_draft_tokens counter",
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}',
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}',
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        *(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {n}'
            for i, n in enumerate(per_pos)
        ),
        "# TYPE vllm:generation_tokens counter",
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}',
    ]
    return "\n".join(lines) + "\n"
