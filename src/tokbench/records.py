"""Raw measurements as frozen dataclasses, and their JSON form.

Every figure tokbench prints derives from these. Times are `perf_counter_ns` integers (one monotonic clock for
every interval); each trial also keeps one wall-clock anchor. A failed request is a record with an
`error_kind`, never an exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tokbench.errors import StoreError

SCHEMA_VERSION = 1


class ErrorKind(str, Enum):
    """Why a request failed. Stored by value, so the strings are part of the result-file format."""

    CONNECT = "connect"  # no connection, or it was refused/reset before any response byte
    HTTP_STATUS = "http_status"  # a non-2xx status
    TIMEOUT = "timeout"  # the per-request deadline passed
    STALL = "stall"  # no byte for stall_timeout seconds
    DISCONNECT = "disconnect"  # the stream ended before the end marker ([DONE] / finish)
    PROTOCOL = "protocol"  # malformed SSE or JSON
    SERVER_ERROR_EVENT = "server_error_event"  # the stream carried an error object
    CANCELLED = "cancelled"  # Ctrl-C or shutdown while in flight


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the client saw it. `chunk_tokens[i]` is how many tokens chunk i carried, as far as the
    protocol tells (SGLang's cumulative counts, per-chunk usage), else 1 per content-bearing chunk."""

    index: int
    prompt_id: str
    scheduled_ns: int  # when the schedule made the request due (queue time = sent_ns - scheduled_ns)
    sent_ns: int
    end_ns: int
    first_token_ns: int | None = None
    chunk_ns: tuple[int, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    output_text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # the server's usage; preferred over counting chunks
    finish_reason: str | None = None
    http_status: int | None = None
    error_kind: ErrorKind | None = None
    error_message: str | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)  # engine extras kept raw: timings, meta_info
    retried: bool = False  # resent once on a fresh connection after a pooled one was found closed
    warmup: bool = False

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else sum(self.chunk_tokens)


@dataclass(frozen=True, slots=True)
class TrialResult:
    """One measured pass at one concurrency: every request record plus the client's self-check."""

    concurrency: int
    trial: int  # index within its level
    order: int  # position in the run's execution order (interleaving, drift)
    started_at: float  # wall-clock anchor, epoch seconds
    start_ns: int  # measurement window: first measured request due ...
    end_ns: int  # ... last measured request ended
    records: tuple[RequestRecord, ...] = ()
    request_rate: float | None = None  # open loop (Poisson) arrivals per second, None for closed loop
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    achieved_concurrency: float | None = None  # time-weighted mean of requests in flight
    client_limited: bool = False
    metrics_before: str | None = None  # raw Prometheus text scraped around the window
    metrics_after: str | None = None
    retry: bool = False  # a re-run of a cell whose first attempt lost its server
    interrupted: bool = False
    imported: Mapping[str, float] | None = None  # figures from a summary-only import (no records)

    @property
    def measured(self) -> tuple[RequestRecord, ...]:
        return tuple(r for r in self.records if not r.warmup)


@dataclass(frozen=True, slots=True)
class LevelResult:
    concurrency: int
    trials: tuple[TrialResult, ...] = ()


@dataclass(frozen=True, slots=True)
class RunMeta:
    run_id: str
    label: str
    tool_version: str
    started_at: str  # ISO 8601, UTC
    base_url: str = ""
    api: str = "chat"
    model: str = ""
    load: Mapping[str, Any] = field(default_factory=dict)  # the LoadSpec as given (no secrets in it)
    server: Mapping[str, Any] = field(default_factory=dict)  # engine, argv, resolved configuration
    environment: Mapping[str, Any] = field(default_factory=dict)  # host, cpu, gpus, versions
    complete: bool = True
    source: str = "tokbench"  # or "import:<file>" for summary-only results


@dataclass(frozen=True, slots=True)
class RunResult:
    meta: RunMeta
    levels: tuple[LevelResult, ...] = ()

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)


def group_trials(trials: Sequence[TrialResult]) -> tuple[LevelResult, ...]:
    """Levels in ascending concurrency, each with its trials in trial order."""
    by_c: dict[int, list[TrialResult]] = {}
    for t in trials:
        by_c.setdefault(t.concurrency, []).append(t)
    return tuple(
        LevelResult(c, tuple(sorted(ts, key=lambda t: (t.trial, t.order)))) for c, ts in sorted(by_c.items())
    )


# ---- JSON form ----


def record_to_dict(r: RequestRecord) -> dict[str, Any]:
    d = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    d["chunk_ns"] = list(r.chunk_ns)
    d["chunk_tokens"] = list(r.chunk_tokens)
    d["error_kind"] = r.error_kind.value if r.error_kind else None
    d["extras"] = dict(r.extras)
    return d


def trial_to_dict(t: TrialResult) -> dict[str, Any]:
    d = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "records"}
    d["imported"] = dict(t.imported) if t.imported is not None else None
    d["records"] = [record_to_dict(r) for r in t.records]
    return d


def run_to_dict(run: RunResult) -> dict[str, Any]:
    meta = {f.name: getattr(run.meta, f.name) for f in dataclasses.fields(run.meta)}
    for k in ("load", "server", "environment"):
        meta[k] = dict(meta[k])
    return {
        "schema_version": SCHEMA_VERSION,
        "meta": meta,
        "levels": [
            {"concurrency": lv.concurrency, "trials": [trial_to_dict(t) for t in lv.trials]}
            for lv in run.levels
        ],
    }


def _build(cls: type[Any], d: Mapping[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in d.items() if k in names})
    except TypeError as e:
        msg = f"{where}: {e}; the result file is not one tokbench wrote, or it was cut short"
        raise StoreError(msg) from e


def record_from_dict(d: Mapping[str, Any], where: str = "record") -> RequestRecord:
    d = dict(d)
    d["chunk_ns"] = tuple(d.get("chunk_ns") or ())
    d["chunk_tokens"] = tuple(d.get("chunk_tokens") or ())
    kind = d.get("error_kind")
    try:
        d["error_kind"] = ErrorKind(kind) if kind else None
    except ValueError:
        raise StoreError(f"{where}.error_kind: unknown value {kind!r}") from None
    return _build(RequestRecord, d, where)  # type: ignore[no-any-return]


def run_from_dict(d: Mapping[str, Any], where: str = "result") -> RunResult:
    """Rebuild a run from its JSON form; extra keys (figures written beside the records) are ignored."""
    if not isinstance(d, Mapping) or "meta" not in d or "levels" not in d:
        msg = f"{where}: expected an object with 'meta' and 'levels'; is this a tokbench result file?"
        raise StoreError(msg)
    meta = _build(RunMeta, d["meta"], f"{where}.meta")
    levels = []
    for i, lv in enumerate(d["levels"]):
        trials = []
        for j, t in enumerate(lv.get("trials", [])):
            w = f"{where}.levels[{i}].trials[{j}]"
            t = dict(t)
            t["records"] = tuple(
                record_from_dict(r, f"{w}.records[{k}]") for k, r in enumerate(t.get("records") or ())
            )
            trials.append(_build(TrialResult, t, w))
        try:
            levels.append(LevelResult(int(lv["concurrency"]), tuple(trials)))
        except (KeyError, TypeError, ValueError):
            raise StoreError(f"{where}.levels[{i}].concurrency: missing or not an integer") from None
    return RunResult(meta, tuple(levels))
