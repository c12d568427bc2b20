"""Result files (tokbench JSON: raw records plus figures), and exports other tools read: vLLM `bench serve`
JSON and CSV.

Figures are recomputed from the records on every write; on read only the records count (figures are ignored).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tokbench.errors import InsufficientDataError, StoreError
from tokbench.records import RequestRecord, RunResult, TrialResult, run_to_dict
from tokbench.stats.summary import METRICS, figure_values, summarize, trial_figures
from tokbench.store.files import read_result_file

# Each level's summary (mean over trials with its 95% t interval) of every figure compare can judge.
SUMMARY_METRICS = tuple(METRICS)
_TRIAL_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialResult))


def jsonable(obj: Any) -> Any:
    """Dataclasses, mappings, enums and numpy scalars as plain JSON values; NaN and infinities become null."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return jsonable(obj.value)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def result_to_json(run: RunResult) -> dict[str, Any]:
    """`run_to_dict` plus figures: each trial dict carries its TrialFigures beside its records (agg_tok_s,
    per_req_tok_s, tokens, wall_s, ok, errors, percentiles ...) and each level a `summary` per metric."""
    d = run_to_dict(run)
    for lv_dict, lv in zip(d["levels"], run.levels, strict=True):
        level_figures = [trial_figures(t) for t in lv.trials]
        for t_dict, figures in zip(lv_dict["trials"], level_figures, strict=True):
            # A figure never overwrites a recorded field of the same name: reading the file back must give the
            # trial that was measured, not a recomputation.
            t_dict.update({k: v for k, v in jsonable(figures).items() if k not in _TRIAL_FIELDS})
        summary: dict[str, Any] = {}
        for metric in SUMMARY_METRICS:
            try:
                summary[metric] = jsonable(
                    summarize(figure_values(level_figures, metric), lv.concurrency, metric)
                )
            except InsufficientDataError:
                summary[metric] = None
        lv_dict["summary"] = summary
    return d


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise StoreError(
            f"{path}: cannot write ({e.strerror or e}); check the directory exists and is writable"
        ) from e


def write_result_json(run: RunResult, path: Path) -> None:
    """Write the result file atomically: a reader (or a crash) sees the old file or the new, never half."""
    write_text_atomic(Path(path), json.dumps(result_to_json(run), indent=1, allow_nan=False) + "\n")


def read_result_json(path: Path) -> RunResult:
    """Read a tokbench result file; StoreError naming the file and the field when it is not one."""
    return read_result_file(path)


# ---- vLLM `bench serve` result JSON ------------------------------------------------------------------------

_VLLM_PERCENTILES = (50, 90, 99)


def _ms_stats(name: str, values_s: Sequence[float]) -> dict[str, float]:
    # vLLM's process_one_metric: mean/median/std and p{N} of seconds*1000, 0 when there are no samples.
    a = np.asarray(values_s, dtype=float) * 1000.0 if len(values_s) else np.zeros(1)
    out = {
        f"mean_{name}_ms": float(np.mean(a)),
        f"median_{name}_ms": float(np.median(a)),
        f"std_{name}_ms": float(np.std(a)),
    }
    for p in _VLLM_PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(a, p))
    return out


def _chunk_gaps_s(r: RequestRecord) -> list[float]:
    # vLLM's `itls`: one gap per streamed chunk after the first, whatever the chunk carried (unlike tokbench's
    # ITL, which splits a k-token chunk's gap into k gaps).
    return [(b - a) / 1e9 for a, b in itertools.pairwise(r.chunk_ns)]


def _ttft_s(r: RequestRecord) -> float:
    return (r.first_token_ns - r.sent_ns) / 1e9 if r.ok and r.first_token_ns is not None else 0.0


def _error_text(r: RequestRecord) -> str:
    # vLLM writes "" for a success and the error's text otherwise.
    if r.ok:
        return ""
    kind = r.error_kind.value if r.error_kind else "error"
    return f"{kind}: {r.error_message}" if r.error_message else kind


def trial_to_vllm(run: RunResult, t: TrialResult) -> dict[str, Any]:
    """One trial as vLLM's `vllm bench serve --save-result` JSON, with vLLM's definitions for the
    distributions (TTFT/E2EL from send, TPOT = (E2EL - TTFT)/(output_len - 1), ITL per chunk) over successful
    requests. `duration` and `output_throughput` are tokbench's Wall(s) and Agg tok/s."""
    figures = trial_figures(t)
    recs = t.measured
    ok = [r for r in recs if r.ok]
    duration = figures.wall_s
    total_in = sum(r.prompt_tokens or 0 for r in ok)
    total_out = figures.tokens
    ttfts = [(r.first_token_ns - r.sent_ns) / 1e9 for r in ok if r.first_token_ns is not None]
    e2els = [(r.end_ns - r.sent_ns) / 1e9 for r in ok]
    tpots = [
        ((r.end_ns - r.first_token_ns) / 1e9) / (r.output_tokens - 1)
        for r in ok
        if r.first_token_ns is not None and r.output_tokens > 1
    ]
    itls = [g for r in ok for g in _chunk_gaps_s(r)]

    def per_second(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    started = datetime.fromtimestamp(t.started_at, tz=timezone.utc) if t.started_at else None
    out: dict[str, Any] = {
        "date": started.strftime("%Y%m%d-%H%M%S") if started else "",
        "backend": "tokbench",
        "endpoint_type": run.meta.api,
        "label": run.meta.label or None,
        "model_id": run.meta.model,
        "tokenizer_id": run.meta.model,
        "num_prompts": len(recs),
        "request_rate": t.request_rate if t.request_rate is not None else "inf",
        "burstiness": 1.0,
        "max_concurrency": t.concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_second(len(ok)),
        "request_goodput": None,
        "output_throughput": figures.agg_tok_s,
        "total_token_throughput": per_second(total_in + total_out),
        "input_lens": [r.prompt_tokens or 0 for r in recs],
        "output_lens": [r.output_tokens if r.ok else 0 for r in recs],
        "ttfts": [_ttft_s(r) for r in recs],
        "itls": [_chunk_gaps_s(r) if r.ok else [] for r in recs],
        "generated_texts": [r.output_text for r in recs],
        "errors": [_error_text(r) for r in recs],
    }
    out.update(_ms_stats("ttft", ttfts))
    out.update(_ms_stats("tpot", tpots))
    out.update(_ms_stats("itl", itls))
    out.update(_ms_stats("e2el", e2els))
    out["tokbench"] = {
        "run_id": run.meta.run_id,
        "concurrency": t.concurrency,
        "trial": t.trial,
        "order": t.order,
        "interrupted": t.interrupted,
        "retry": t.retry,
        "client_limited": t.client_limited,
    }
    return out


def to_vllm_bench_json(run: RunResult) -> list[dict[str, Any]]:
    """One vLLM result object per level and trial (trials with records only; imported summaries have none)."""
    return [trial_to_vllm(run, t) for lv in run.levels for t in lv.trials if t.measured]


def vllm_jsonl(run: RunResult) -> str:
    """The objects one per line, as `vllm bench serve --append-result` writes them; one trial gives a plain
    JSON file."""
    return "".join(json.dumps(jsonable(o), allow_nan=False) + "\n" for o in to_vllm_bench_json(run))


# ---- CSV ---------------------------------------------------------------------------------------------------

REQUEST_COLUMNS = (
    "run_id", "label", "concurrency", "trial", "order", "index", "prompt_id", "ok", "error_kind",
    "http_status", "finish_reason", "prompt_tokens", "output_tokens", "chunks", "queue_ms", "ttft_ms",
    "e2e_ms", "retried", "error_message",
)  # fmt: skip
TRIAL_COLUMNS = (
    "run_id", "label", "concurrency", "trial", "order", "requests", "ok", "errors", "tokens", "wall_s",
    "agg_tok_s", "per_req_tok_s", "ttft_p50_ms", "itl_p50_ms", "e2e_p99_ms", "achieved_concurrency",
    "loop_lag_p99_ms", "client_limited", "interrupted", "retry",
)  # fmt: skip


def _ms(a: int | None, b: int | None) -> float | None:
    return round((b - a) / 1e6, 3) if a is not None and b is not None else None


def _request_rows(run: RunResult) -> Iterable[dict[str, Any]]:
    for lv in run.levels:
        for t in lv.trials:
            for r in t.measured:
                yield {
                    "run_id": run.meta.run_id,
                    "label": run.meta.label,
                    "concurrency": t.concurrency,
                    "trial": t.trial,
                    "order": t.order,
                    "index": r.index,
                    "prompt_id": r.prompt_id,
                    "ok": int(r.ok),
                    "error_kind": r.error_kind.value if r.error_kind else "",
                    "http_status": r.http_status,
                    "finish_reason": r.finish_reason,
                    "prompt_tokens": r.prompt_tokens,
                    "output_tokens": r.output_tokens,
                    "chunks": len(r.chunk_ns),
                    "queue_ms": _ms(r.scheduled_ns, r.sent_ns),
                    "ttft_ms": _ms(r.sent_ns, r.first_token_ns),
                    "e2e_ms": _ms(r.sent_ns, r.end_ns),
                    "retried": int(r.retried),
                    "error_message": r.error_message,
                }


def _pct(p: Any, key: str) -> Any:
    # Percentiles is the STATS engineer's type; read by attribute or key so either shape works.
    if p is None:
        return None
    return p.get(key) if isinstance(p, Mapping) else getattr(p, key, None)


def _trial_rows(run: RunResult) -> Iterable[dict[str, Any]]:
    for lv in run.levels:
        for t in lv.trials:
            f = trial_figures(t)
            yield {
                "run_id": run.meta.run_id,
                "label": run.meta.label,
                "concurrency": t.concurrency,
                "trial": t.trial,
                "order": t.order,
                "requests": f.requests,
                "ok": f.ok,
                "errors": sum(f.errors.values()),
                "tokens": f.tokens,
                "wall_s": f.wall_s,
                "agg_tok_s": f.agg_tok_s,
                "per_req_tok_s": f.per_req_tok_s,
                "ttft_p50_ms": _pct(f.ttft_ms, "p50"),
                "itl_p50_ms": _pct(f.itl_ms, "p50"),
                "e2e_p99_ms": _pct(f.e2e_ms, "p99"),
                "achieved_concurrency": f.achieved_concurrency,
                "loop_lag_p99_ms": f.loop_lag_p99_ms,
                "client_limited": int(f.client_limited),
                "interrupted": int(t.interrupted),
                "retry": int(t.retry),
            }


def to_csv(run: RunResult, rows: Literal["request", "trial"] = "request") -> str:
    """CSV with a header: one row per measured request (default) or one row per trial with its figures."""
    buf = io.StringIO()
    columns, source = (REQUEST_COLUMNS, _request_rows) if rows == "request" else (TRIAL_COLUMNS, _trial_rows)
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for row in source(run):
        w.writerow({k: ("" if v is None else v) for k, v in jsonable(row).items()})
    return buf.getvalue()


ExportFormat = Literal["json", "vllm", "csv", "csv-trials"]


def export_run(run: RunResult, fmt: ExportFormat, path: Path) -> None:
    """Write `run` to `path` in `fmt`, atomically."""
    if fmt == "json":
        write_result_json(run, path)
    elif fmt == "vllm":
        write_text_atomic(path, vllm_jsonl(run))
    elif fmt == "csv":
        write_text_atomic(path, to_csv(run, "request"))
    elif fmt == "csv-trials":
        write_text_atomic(path, to_csv(run, "trial"))
    else:  # pragma: no cover - the CLI's Choice guards this
        raise StoreError(f"--format: unknown format {fmt!r}; use json, vllm, csv or csv-trials")
