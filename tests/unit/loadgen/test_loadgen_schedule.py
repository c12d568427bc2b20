"""Scheduling with fake requests and fake clocks: trial order, the closed loop, Poisson arrivals, the open
loop, the steady window, and run_trial's accounting (requests per level, self-check, cancellation)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest

from tokbench.config import load_spec
from tokbench.loadgen.runner import run_trial
from tokbench.loadgen.schedule import (
    achieved_concurrency,
    closed_loop,
    open_loop,
    poisson_offsets,
    steady_window,
    trial_order,
)
from tokbench.records import ErrorKind, RequestRecord
from tokbench.workload import Prompt, load_prompts


class FakeClock:
    """Nanoseconds that advance only when a test says so, so every timestamp is exact."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


T = TypeVar("T")


class VirtualTime(FakeClock):
    """Discrete-event time: `sleep` parks a coroutine until the clock is moved to its wake time, which `run`
    does once everything runnable has settled. Durations are then exact however many tasks interleave."""

    def __init__(self) -> None:
        super().__init__()
        self._timers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + round(seconds * 1e9), next(self._seq), fut))
        await fut

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        task = asyncio.ensure_future(coro)
        try:
            while not task.done():
                for _ in range(20):
                    await asyncio.sleep(0)
                if self._timers and not task.done():
                    wake, _, fut = heapq.heappop(self._timers)
                    self.now = max(self.now, wake)
                    if not fut.done():
                        fut.set_result(None)
        except asyncio.CancelledError:
            task.cancel()
            return await task
        return task.result()


def rec(index: int, sent: int, end: int, scheduled: int | None = None, **kw: object) -> RequestRecord:
    return RequestRecord(index, f"p{index}", sent if scheduled is None else scheduled, sent, end, **kw)  # type: ignore[arg-type]


# ---- trial order -----------------------------------------------------------------------------------------


def test_interleaved_and_blocked_order() -> None:
    spec = load_spec(base_url="http://h", concurrencies=(1, 4, 16, 32), trials=2)
    assert [c for c, _ in trial_order(spec)] == [1, 4, 16, 32, 1, 4, 16, 32]
    assert [t for _, t in trial_order(spec)] == [0, 0, 0, 0, 1, 1, 1, 1]
    blocked = trial_order(spec.model_copy(update={"order": "blocked"}))
    assert blocked == [(1, 0), (1, 1), (4, 0), (4, 1), (16, 0), (16, 1), (32, 0), (32, 1)]


def test_shuffled_order_is_seeded_and_round_by_round() -> None:
    spec = load_spec(base_url="http://h", concurrencies=(1, 2, 4, 8, 16), trials=6, order="shuffled", seed=3)
    order = trial_order(spec)
    assert order == trial_order(spec)  # same seed, same order
    for t in range(6):
        rnd = order[t * 5 : (t + 1) * 5]
        assert {c for c, _ in rnd} == {1, 2, 4, 8, 16} and {tt for _, tt in rnd} == {t}
    rounds = {tuple(c for c, _ in order[t * 5 : (t + 1) * 5]) for t in range(6)}
    assert len(rounds) > 1  # actually shuffled
    other = trial_order(spec.model_copy(update={"seed": 4}))
    assert other != order and sorted(other) == sorted(order)


# ---- closed loop -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency, n", [(1, 4), (4, 8), (16, 32), (5, 3)])
async def test_closed_loop_keeps_exactly_c_in_flight(concurrency: int, n: int) -> None:
    clock = FakeClock()
    in_flight: set[int] = set()
    at_start: list[int] = []  # how many were in flight when each request started
    max_seen = 0
    done: list[RequestRecord] = []

    async def send(i: int, due: int) -> RequestRecord:
        nonlocal max_seen
        at_start.append(len(in_flight))
        in_flight.add(i)
        max_seen = max(max_seen, len(in_flight))
        sent = clock()
        for _ in range(1 + (i * 7) % 5):  # uneven durations: completion order differs from send order
            clock.now += 10
            await asyncio.sleep(0)
        in_flight.discard(i)
        return rec(i, sent, clock(), scheduled=due)

    await closed_loop(send, n, concurrency, clock=clock, on_done=done.append)
    target = min(concurrency, n)
    assert sorted(r.index for r in done) == list(range(n))
    assert max_seen == target
    # The first C start together; every later one starts when exactly one of C has just finished.
    assert at_start[:target] == list(range(target))
    assert all(k == target - 1 for k in at_start[target:])
    # A later request was due the moment the one before it on its lane ended.
    ends = {r.end_ns for r in done}
    first_due = {r.scheduled_ns for r in done if r.index < target}
    assert first_due == {1_000}
    assert all(r.scheduled_ns in ends for r in done if r.index >= target)


async def test_closed_loop_stops_a_lane_on_cancelled_record() -> None:
    clock = FakeClock()
    sent: list[int] = []

    async def send(i: int, due: int) -> RequestRecord:
        sent.append(i)
        await asyncio.sleep(0)
        kind = ErrorKind.CANCELLED if i == 0 else None
        return rec(i, clock(), clock(), error_kind=kind)

    out: list[RequestRecord] = []
    await closed_loop(send, 10, 1, clock=clock, on_done=out.append)
    assert sent == [0] and len(out) == 1


async def test_closed_loop_failure_cancels_the_other_lanes() -> None:
    clock = FakeClock()
    cancelled = 0

    async def send(i: int, due: int) -> RequestRecord:
        nonlocal cancelled
        try:
            await asyncio.sleep(0 if i == 0 else 10)
        except asyncio.CancelledError:
            cancelled += 1
            return rec(i, 0, 0, error_kind=ErrorKind.CANCELLED)
        return rec(i, 0, 0)

    def on_done(r: RequestRecord) -> None:
        if r.index == 0:
            raise RuntimeError("store is full")

    with pytest.raises(RuntimeError, match="store is full"):
        await asyncio.wait_for(closed_loop(send, 8, 4, clock=clock, on_done=on_done), 5)
    assert cancelled == 3


# ---- Poisson / open loop ---------------------------------------------------------------------------------


def test_poisson_offsets_statistics() -> None:
    rate = 40.0
    off = np.array(poisson_offsets(20_000, rate, np.random.default_rng(7)))
    gaps = np.diff(off) / 1e9
    assert off[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    # Counts per 1-second window are Poisson: variance equals the mean.
    counts = np.bincount((off / 1e9).astype(int))[:-1]
    assert counts.var() / counts.mean() == pytest.approx(1.0, rel=0.15)
    same = [poisson_offsets(50, rate, np.random.default_rng(seed)) for seed in (7, 7, 8)]
    assert same[0] == same[1] != same[2]


async def test_open_loop_sends_on_schedule_within_the_cap() -> None:
    vt = VirtualTime()
    offsets = [0, 0, 0, 5_000, 6_000, 50_000]
    in_flight = 0
    max_seen = 0

    async def send(i: int, due: int) -> RequestRecord:
        nonlocal in_flight, max_seen
        assert vt() >= due  # never early
        sent = vt()
        in_flight += 1
        max_seen = max(max_seen, in_flight)
        await vt.sleep(20e-6)  # each request takes 20 us
        in_flight -= 1
        return rec(i, sent, vt(), scheduled=due)

    done: list[RequestRecord] = []
    await vt.run(open_loop(send, offsets, 2, clock=vt, on_done=done.append, sleep=vt.sleep))
    assert len(done) == 6 and max_seen == 2
    by_index = {r.index: r for r in done}
    assert [by_index[i].scheduled_ns - 1_000 for i in range(6)] == offsets
    # Arrivals 2-4 waited for a slot (two 20 us requests at a time); the last found the server idle.
    queued = [by_index[i].sent_ns - by_index[i].scheduled_ns for i in range(6)]
    assert queued == [0, 0, 20_000, 15_000, 34_000, 0]


# ---- window measures -------------------------------------------------------------------------------------


def test_steady_window_and_achieved_concurrency() -> None:
    # C=2, 4 requests: lanes start at 0; 0 ends at 10 -> 2 starts; 1 ends at 12 -> 3 starts; drain after.
    rs = [rec(0, 0, 10), rec(1, 0, 12), rec(2, 10, 30), rec(3, 12, 20)]
    assert steady_window(rs, 2) == (0, 12)
    assert achieved_concurrency(rs, 0, 12) == pytest.approx(2.0)
    assert achieved_concurrency(rs, 0, 30) == pytest.approx((10 + 12 + 20 + 8) / 30)
    # A client that leaves gaps between a request's end and the next send shows fewer in flight.
    gappy = [rec(0, 0, 10), rec(1, 0, 10), rec(2, 15, 25), rec(3, 15, 25)]
    assert achieved_concurrency(gappy, *steady_window(gappy, 2) or (0, 0)) == pytest.approx(1.0 * 20 / 15)
    assert steady_window(rs[:3], 2) is None  # fewer than 2*C requests: no steady state to judge
    assert achieved_concurrency(rs, 5, 5) is None


# ---- run_trial with a fake client ------------------------------------------------------------------------


class FakeClient:
    """Stands in for StreamClient: each request takes `ms` of virtual time after `pre_ms` of client delay."""

    def __init__(self, ms: float = 3.0, hang: bool = False, pre_ms: float = 0.0) -> None:
        self.clock = VirtualTime()
        self.ms = ms
        self.pre_ms = pre_ms
        self.hang = hang

    async def request(
        self, prompt: Prompt, index: int, scheduled_ns: int, *, warmup: bool = False
    ) -> RequestRecord:
        if self.pre_ms:
            await self.clock.sleep(self.pre_ms / 1e3)
        sent = self.clock()
        try:
            await self.clock.sleep(self.ms / 1e3)
            if self.hang and index >= 2:
                await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return rec(index, sent, self.clock(), scheduled=scheduled_ns, error_kind=ErrorKind.CANCELLED)
        end = self.clock()
        return RequestRecord(index, prompt.id, scheduled_ns, sent, end, end - 1, (end,), (10,),
                             completion_tokens=10, warmup=warmup)  # fmt: skip


@pytest.mark.parametrize("concurrency, expected", [(1, 4), (2, 4), (3, 6), (16, 32)])
async def test_run_trial_default_requests_per_level(concurrency: int, expected: int) -> None:
    spec = load_spec(base_url="http://h", concurrencies=(concurrency,))
    client = FakeClient()
    progress: list[Any] = []
    t = await client.clock.run(
        run_trial(client, spec, load_prompts(spec), concurrency, 0, 0, on_progress=progress.append)  # type: ignore[arg-type]
    )
    assert len(t.records) == expected and all(r.ok for r in t.records)
    assert [r.index for r in t.records] == list(range(expected))
    assert progress[-1].done == progress[-1].ok == expected and progress[-1].total == expected
    assert t.start_ns <= min(r.sent_ns for r in t.records) and t.end_ns == max(r.end_ns for r in t.records)
    assert t.achieved_concurrency == pytest.approx(concurrency, rel=0.01)
    # concurrency was kept (virtual time); the loop-lag rule reads the real loop, which a busy machine stalls
    lagged = t.loop_lag_p99_ms is not None and t.loop_lag_p99_ms > spec.lag_threshold_ms
    assert not t.interrupted and t.client_limited == lagged


async def test_run_trial_requests_override_and_scrapes() -> None:
    spec = load_spec(base_url="http://h", concurrencies=(4,), requests=10)
    scrapes = iter(["before", "after"])

    async def scrape() -> str | None:
        return next(scrapes)

    client = FakeClient()
    t = await client.clock.run(run_trial(client, spec, load_prompts(spec), 4, 1, 3, scrape=scrape))  # type: ignore[arg-type]
    assert len(t.records) == 10 and (t.trial, t.order) == (1, 3)
    assert (t.metrics_before, t.metrics_after) == ("before", "after")


async def test_run_trial_flags_a_client_that_cannot_keep_concurrency() -> None:
    spec = load_spec(base_url="http://h", concurrencies=(4,))
    client = FakeClient(ms=3, pre_ms=2)  # the client spends 2 ms before each send of a 3 ms request
    t = await client.clock.run(run_trial(client, spec, load_prompts(spec), 4, 0, 0))  # type: ignore[arg-type]
    assert t.achieved_concurrency == pytest.approx(4 * 3 / 5, rel=0.01)
    assert t.client_limited
    queue = [r.sent_ns - r.scheduled_ns for r in t.records]
    assert queue == [2_000_000] * 8  # the client's own delay shows as queue time


class BlockingClient(FakeClient):
    """A client whose parsing holds the event loop: 80 ms of real, blocking work per request."""

    async def request(
        self, prompt: Prompt, index: int, scheduled_ns: int, *, warmup: bool = False
    ) -> RequestRecord:
        time.sleep(0.08)
        return await super().request(prompt, index, scheduled_ns, warmup=warmup)


async def test_run_trial_flags_a_client_whose_event_loop_lags() -> None:
    spec = load_spec(base_url="http://h", concurrencies=(2,), requests=6, lag_threshold_ms=50)
    client = BlockingClient(ms=30)
    t = await client.clock.run(run_trial(client, spec, load_prompts(spec), 2, 0, 0))  # type: ignore[arg-type]
    assert t.achieved_concurrency == pytest.approx(2, rel=0.01)  # concurrency held: only the lag can flag it
    assert t.loop_lag_p99_ms is not None and t.loop_lag_p99_ms > 50 and t.loop_lag_max_ms is not None
    assert t.client_limited
    relaxed = load_spec(base_url="http://h", concurrencies=(2,), requests=6, lag_threshold_ms=10_000)
    other = BlockingClient(ms=30)
    t2 = await other.clock.run(run_trial(other, relaxed, load_prompts(relaxed), 2, 0, 0))  # type: ignore[arg-type]
    assert not t2.client_limited


async def test_run_trial_cancelled_keeps_finished_and_marks_in_flight() -> None:
    spec = load_spec(base_url="http://h", concurrencies=(2,), requests=20)
    seen: list[RequestRecord] = []
    client = FakeClient(hang=True)
    task = asyncio.ensure_future(
        client.clock.run(run_trial(client, spec, load_prompts(spec), 2, 0, 0, on_record=seen.append))  # type: ignore[arg-type]
    )
    while len(seen) < 2:
        await asyncio.sleep(0.001)
    for _ in range(20):
        await asyncio.sleep(0)
    task.cancel()
    t = await asyncio.wait_for(task, 5)
    assert t.interrupted
    kinds = Counter(r.error_kind for r in t.records)
    assert kinds == {None: 2, ErrorKind.CANCELLED: 2}
    assert len(seen) == 4  # the store heard of every record, the cancelled ones too
