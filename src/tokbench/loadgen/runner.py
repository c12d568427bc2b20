"""A sweep: warmup, then each (level, trial) in the planned order, with the client's self-check per trial.

Cancellation (Ctrl-C) is part of the contract: requests in flight become `cancelled` records, the trial is
marked interrupted, the run incomplete, and everything finished is returned (and was handed to `on_record`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import platform
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import Any

import aiohttp
import numpy as np

from tokbench import __version__
from tokbench.config import LoadSpec
from tokbench.errors import ConfigError
from tokbench.loadgen.client import StreamClient, resolve_model
from tokbench.loadgen.schedule import (
    Clock,
    achieved_concurrency,
    closed_loop,
    open_loop,
    poisson_offsets,
    steady_window,
    trial_order,
)
from tokbench.records import RequestRecord, RunMeta, RunResult, TrialResult, group_trials
from tokbench.workload import PromptSource, load_prompts

__all__ = ["LagSampler", "Progress", "run_sweep", "run_trial", "run_warmup", "sweep_sync", "trial_order"]

Scrape = Callable[[], Awaitable[str | None]]
OnRecord = Callable[[RequestRecord], None]
OnCellRecord = Callable[[int, int, RequestRecord], None]  # (concurrency, trial, record)
_MIN_STEADY_FRACTION = 0.9  # achieved / target concurrency below this in the steady window: client-limited


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a trial stands, after each finished request."""

    concurrency: int
    trial: int
    done: int
    total: int
    ok: int
    errors: int


class LagSampler:
    """Event-loop lag: a task sleeps `interval_s` over and over and records how late it woke. A busy loop (the
    client parsing more than it can) shows as lag long before it shows in the figures."""

    def __init__(self, clock: Clock = time.perf_counter_ns, interval_s: float = 0.01) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self.samples_ns: list[int] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        interval_ns = int(self._interval_s * 1e9)
        while True:
            t0 = self._clock()
            await asyncio.sleep(self._interval_s)
            self.samples_ns.append(max(0, self._clock() - t0 - interval_ns))

    def p99_ms(self) -> float | None:
        return float(np.percentile(self.samples_ns, 99)) / 1e6 if self.samples_ns else None

    def max_ms(self) -> float | None:
        return max(self.samples_ns) / 1e6 if self.samples_ns else None


async def run_trial(
    client: StreamClient,
    spec: LoadSpec,
    source: PromptSource,
    concurrency: int,
    trial: int,
    order: int,
    *,
    on_record: OnRecord | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    scrape: Scrape | None = None,
    rng: np.random.Generator | None = None,
    wall: Callable[[], float] = time.time,
) -> TrialResult:
    """One measured pass at one concurrency. Returns (never raises) when cancelled: `interrupted=True`."""
    clock = client.clock
    n = spec.requests_for(concurrency)
    prompts = source.draw(concurrency, trial, n)
    records: list[RequestRecord] = []
    ok = 0

    def on_done(rec: RequestRecord) -> None:
        nonlocal ok
        records.append(rec)
        ok += rec.ok
        if on_record is not None:
            on_record(rec)
        if on_progress is not None:
            on_progress(Progress(concurrency, trial, len(records), n, ok, len(records) - ok))

    def send(i: int, due: int) -> Awaitable[RequestRecord]:
        return client.request(prompts[i], i, due)

    interrupted = False
    before = after = None
    lag = LagSampler()  # the real loop's lag, whatever clock stamps the records
    started_at = wall()
    start = clock()
    try:
        before = await scrape() if scrape is not None else None
        started_at = wall()
        lag.start()
        start = clock()
        if spec.request_rate is not None:
            gen = rng if rng is not None else np.random.default_rng([spec.seed, 0xA7, concurrency, trial])
            await open_loop(
                send,
                poisson_offsets(n, spec.request_rate, gen),
                concurrency,
                clock=clock,
                on_done=on_done,
                start_ns=start,
            )
        else:
            await closed_loop(send, n, concurrency, clock=clock, on_done=on_done, start_ns=start)
        end = max((r.end_ns for r in records), default=clock())
        await lag.stop()
        after = await scrape() if scrape is not None else None
    except asyncio.CancelledError:
        interrupted = True
        _uncancel()
        end = max((r.end_ns for r in records), default=clock())
    finally:
        await lag.stop()  # idempotent; here so that no exception leaves the sampler running

    window = steady_window(records, concurrency) if spec.request_rate is None else None
    achieved = achieved_concurrency(records, *(window or (start, end)))
    lag_p99 = lag.p99_ms()
    limited = lag_p99 is not None and lag_p99 > spec.lag_threshold_ms
    if window is not None and achieved is not None and achieved < _MIN_STEADY_FRACTION * concurrency:
        limited = True
    return TrialResult(
        concurrency=concurrency,
        trial=trial,
        order=order,
        started_at=started_at,
        start_ns=start,
        end_ns=end,
        records=tuple(sorted(records, key=lambda r: r.index)),
        request_rate=spec.request_rate,
        loop_lag_p99_ms=lag_p99,
        loop_lag_max_ms=lag.max_ms(),
        achieved_concurrency=achieved,
        client_limited=limited,
        metrics_before=before,
        metrics_after=after,
        interrupted=interrupted,
    )


async def run_warmup(
    client: StreamClient, spec: LoadSpec, source: PromptSource, *, on_record: OnRecord | None = None
) -> list[RequestRecord]:
    """`spec.warmup` requests (flagged warmup=True) before anything is measured. Cancellation propagates; the
    records finished by then went to `on_record`."""
    n = spec.warmup
    if n <= 0:
        return []
    prompts = source.draw(0, 0, n)
    records: list[RequestRecord] = []

    def on_done(rec: RequestRecord) -> None:
        records.append(rec)
        if on_record is not None:
            on_record(rec)

    def send(i: int, due: int) -> Awaitable[RequestRecord]:
        return client.request(prompts[i], i, due, warmup=True)

    await closed_loop(send, n, min(n, max(spec.concurrencies)), clock=client.clock, on_done=on_done)
    return records


async def run_sweep(
    spec: LoadSpec,
    *,
    api_key: str | None = None,
    label: str = "",
    on_start: Callable[[RunMeta], None] | None = None,
    on_record: OnCellRecord | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_trial: Callable[[TrialResult], None] | None = None,
    scrape: Scrape | None = None,
    server: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    clock: Clock = time.perf_counter_ns,
) -> RunResult:
    """Warmup, then every (level, trial) of `trial_order(spec)`. `on_start` gets the run's metadata before the
    first request (a store begins the run there); `on_record(concurrency, trial, record)` gets each finished
    record; `on_trial` each finished trial. Cancelled: returns what finished with `meta.complete=False`."""
    source = load_prompts(spec)  # a bad prompt file fails before anything is sent
    model = spec.model or await _default_model(spec, api_key)
    spec = spec.model_copy(update={"model": model})
    meta = RunMeta(
        run_id=uuid.uuid4().hex,
        label=label or spec.label,
        tool_version=__version__,
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        base_url=spec.base_url,
        api=spec.api,
        model=model,
        load=spec.model_dump(mode="json"),
        server=dict(server or {}),
        environment=dict(environment) if environment is not None else local_environment(),
    )
    if on_start is not None:
        on_start(meta)
    order = trial_order(spec)
    trials: list[TrialResult] = []
    warm: list[RequestRecord] = []
    interrupted = False
    first = order[0]

    def cell_record(c: int, t: int) -> OnRecord | None:
        return None if on_record is None else (lambda r: on_record(c, t, r))

    try:
        async with StreamClient(spec, api_key, clock=clock) as client:
            warm = await run_warmup(client, spec, source, on_record=cell_record(*first))
            for k, (c, t) in enumerate(order):
                tr = await run_trial(
                    client,
                    spec,
                    source,
                    c,
                    t,
                    k,
                    on_record=cell_record(c, t),
                    on_progress=on_progress,
                    scrape=scrape,
                )
                if k == 0 and warm:
                    # Warmup records live in the first trial (flagged, so figures skip them).
                    tr = dataclasses.replace(tr, records=(*warm, *tr.records))
                trials.append(tr)
                if on_trial is not None:
                    on_trial(tr)
                if tr.interrupted:
                    interrupted = True
                    break
    except asyncio.CancelledError:
        interrupted = True
        _uncancel()
    if interrupted and not trials and warm:
        now = clock()
        trials.append(
            TrialResult(first[0], first[1], 0, time.time(), now, now, tuple(warm), interrupted=True)
        )
    meta = dataclasses.replace(meta, complete=not interrupted)
    return RunResult(meta, group_trials(trials))


def sweep_sync(spec: LoadSpec, **kwargs: Any) -> RunResult:
    """`run_sweep` in a fresh event loop, with Ctrl-C turned into a clean cancellation (partial result)."""

    async def main() -> RunResult:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        installed = False
        if task is not None:
            try:
                loop.add_signal_handler(signal.SIGINT, task.cancel)
                installed = True
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signal support: Ctrl-C raises KeyboardInterrupt instead
        try:
            return await run_sweep(spec, **kwargs)
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())


async def _default_model(spec: LoadSpec, api_key: str | None) -> str:
    try:
        return await resolve_model(spec.base_url, api_key)
    except ConfigError:
        if spec.api == "sglang":
            return ""  # /generate needs no model name
        raise


def local_environment() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "tokbench": __version__,
        "aiohttp": aiohttp.__version__,
    }


def _uncancel() -> None:
    """We handle this cancellation (partial results); tell asyncio (3.11+) so later timeouts work normally."""
    task = asyncio.current_task()
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()
