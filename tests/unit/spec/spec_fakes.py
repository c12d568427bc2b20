"""Synthetic runs for the speculative accounting tests: records with engine extras, trials with scrapes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokbench.records import ErrorKind, LevelResult, RequestRecord, RunMeta, RunResult, TrialResult

S = 1_000_000_000  # ns
FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def rec(
    index: int,
    *,
    tokens: int = 100,
    extras: Mapping[str, Any] | None = None,
    prompt_id: str | None = None,
    text: str = "",
    error: ErrorKind | None = None,
    warmup: bool = False,
    end_s: float = 1.0,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_id=prompt_id if prompt_id is not None else f"p{index}",
        scheduled_ns=0,
        sent_ns=0,
        end_ns=int(end_s * S),
        first_token_ns=1,
        chunk_ns=(1,),
        chunk_tokens=(tokens,),
        output_text=text,
        completion_tokens=None if error else tokens,
        finish_reason=None if error else "length",
        error_kind=error,
        extras=dict(extras or {}),
        warmup=warmup,
    )


def trial(
    records: Sequence[RequestRecord],
    *,
    concurrency: int = 1,
    index: int = 0,
    window_s: float = 10.0,
    before: str | None = None,
    after: str | None = None,
) -> TrialResult:
    return TrialResult(
        concurrency=concurrency,
        trial=index,
        order=index,
        started_at=0.0,
        start_ns=0,
        end_ns=int(window_s * S),
        records=tuple(records),
        metrics_before=before,
        metrics_after=after,
    )


def run(
    trials: Sequence[TrialResult],
    *,
    label: str = "run",
    server: Mapping[str, Any] | None = None,
    load: Mapping[str, Any] | None = None,
) -> RunResult:
    levels: dict[int, list[TrialResult]] = {}
    for t in trials:
        levels.setdefault(t.concurrency, []).append(t)
    meta = RunMeta(
        run_id=label,
        label=label,
        tool_version="test",
        started_at="2025-01-01T00:00:00Z",
        server=dict(server or {}),
        load=dict(load or {"temperature": 0.0}),
    )
    return RunResult(meta, tuple(LevelResult(c, tuple(ts)) for c, ts in sorted(levels.items())))


def throughput_run(
    tok_s: Mapping[int, float],
    *,
    label: str,
    trials: int = 2,
    extras: Mapping[str, Any] | None = None,
    server: Mapping[str, Any] | None = None,
) -> RunResult:
    """A run whose level C has aggregate throughput tok_s[C] in every trial (10 s windows, C requests)."""
    out = []
    for c, rate in tok_s.items():
        for i in range(trials):
            per_req = round(rate * 10 / c)
            recs = [rec(j, tokens=per_req, extras=extras) for j in range(c)]
            out.append(trial(recs, concurrency=c, index=i, window_s=10.0))
    return run(out, label=label, server=server)


def vllm_metrics(
    drafts: float, draft_tokens: float, accepted: float, per_pos: Sequence[float], gen: float
) -> str:
    """vLLM's exposition of the spec counters for two engines (DP), each holding half of every count."""
    lines = []
    for name, v in (
        ("vllm:spec_decode_num_drafts", drafts),
        ("vllm:spec_decode_num_draft_tokens", draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", accepted),
        ("vllm:generation_tokens", gen),
    ):
        lines += [f"# HELP {name}_total x", f"# TYPE {name}_total counter"]
        for e in ("0", "1"):
            lines.append(f'{name}_total{{engine="{e}",model_name="m"}} {v / 2}')
            lines.append(f'{name}_created{{engine="{e}",model_name="m"}} 1.7e9')
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {name}_total x", f"# TYPE {name}_total counter"]
    for e in ("0", "1"):
        for i, v in enumerate(per_pos):
            lines.append(f'{name}_total{{engine="{e}",model_name="m",position="{i}"}} {v / 2}')
    lines += ["# HELP sglang:spec_accept_length x", "# TYPE sglang:spec_accept_length gauge"]
    lines.append("sglang:spec_accept_length 9.9")
    return "\n".join(lines) + "\n"
