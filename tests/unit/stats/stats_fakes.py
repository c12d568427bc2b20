"""Synthetic request records and trials with known timing, so every figure has a hand-computable truth."""

from __future__ import annotations

from collections.abc import Sequence

from tokbench.records import ErrorKind, LevelResult, RequestRecord, RunMeta, RunResult, TrialResult

MS = 1_000_000  # ns


def record(
    index: int,
    sent_ms: float,
    *,
    ttft_ms: float = 50.0,
    itl_ms: float = 10.0,
    tokens: int = 10,
    per_chunk: int = 1,
    scheduled_ms: float | None = None,
    completion_tokens: int | None = None,
    error: ErrorKind | None = None,
    prompt_id: str | None = None,
    warmup: bool = False,
) -> RequestRecord:
    """A streamed request: first chunk at sent+ttft, then one chunk every `itl_ms * per_chunk` carrying
    `per_chunk` tokens (the last chunk may carry fewer); the request ends with the last chunk."""
    sent = int(sent_ms * MS)
    counts: list[int] = []
    left = tokens
    while left > 0:
        counts.append(min(per_chunk, left))
        left -= counts[-1]
    times = [sent + int(ttft_ms * MS)]
    for k in counts[1:]:
        times.append(times[-1] + int(itl_ms * k * MS))
    return RequestRecord(
        index=index,
        prompt_id=prompt_id if prompt_id is not None else f"p{index}",
        scheduled_ns=int((scheduled_ms if scheduled_ms is not None else sent_ms) * MS),
        sent_ns=sent,
        end_ns=times[-1] if times else sent,
        first_token_ns=times[0] if times else None,
        chunk_ns=tuple(times),
        chunk_tokens=tuple(counts),
        completion_tokens=completion_tokens if completion_tokens is not None else tokens,
        error_kind=error,
        warmup=warmup,
    )


def closed_loop_trial(
    concurrency: int,
    requests: int,
    *,
    trial: int = 0,
    ttft_ms: float = 50.0,
    itl_ms: float = 10.0,
    tokens: int = 20,
    per_chunk: int = 1,
    gap_ms: float = 0.0,
    client_limited: bool = False,
    prompt_prefix: str = "p",
) -> TrialResult:
    """`concurrency` slots, round-robin; a slot sends its next request `gap_ms` after the last one ended."""
    slot_free = [0.0] * concurrency
    records = []
    duration = ttft_ms + (tokens - 1) * itl_ms
    for i in range(requests):
        s = i % concurrency
        sent = slot_free[s]
        records.append(
            record(
                i,
                sent,
                ttft_ms=ttft_ms,
                itl_ms=itl_ms,
                tokens=tokens,
                per_chunk=per_chunk,
                prompt_id=f"{prompt_prefix}{trial}-{i}",
            )
        )
        slot_free[s] = sent + duration + gap_ms
    return TrialResult(
        concurrency=concurrency,
        trial=trial,
        order=trial,
        started_at=0.0,
        start_ns=0,
        end_ns=max(r.end_ns for r in records),
        records=tuple(records),
        client_limited=client_limited,
        loop_lag_p99_ms=80.0 if client_limited else 1.0,
        achieved_concurrency=float(concurrency),
    )


def speed_trial(concurrency: int, trial: int, speed: float, *, tokens: int = 20) -> TrialResult:
    """A closed-loop trial whose inter-token latency is 10 ms / speed: agg tok/s scales almost with speed."""
    return closed_loop_trial(
        concurrency, 2 * concurrency, trial=trial, ttft_ms=1.0, itl_ms=10.0 / speed, tokens=tokens
    )


def run_of(
    trials: Sequence[TrialResult], label: str = "run", load: dict[str, object] | None = None
) -> RunResult:
    by_c: dict[int, list[TrialResult]] = {}
    for t in trials:
        by_c.setdefault(t.concurrency, []).append(t)
    levels = tuple(LevelResult(c, tuple(ts)) for c, ts in sorted(by_c.items()))
    meta = RunMeta(run_id=f"id-{label}", label=label, tool_version="test", started_at="2026-01-01T00:00:00Z",
                   load=load or {})  # fmt: skip
    return RunResult(meta, levels)
