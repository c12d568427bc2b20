"""When requests are sent: closed loop at fixed concurrency, open loop with Poisson arrivals, the order of
trials, and how well the client kept to its schedule. Knows nothing of HTTP: a request is any
`send(index, scheduled_ns) -> RequestRecord` coroutine, so tests drive it with fakes and fake clocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import numpy as np

from tokbench.config import LoadSpec
from tokbench.records import ErrorKind, RequestRecord

Clock = Callable[[], int]
Send = Callable[[int, int], Awaitable[RequestRecord]]
OnDone = Callable[[RequestRecord], None]
Sleep = Callable[[float], Awaitable[None]]


def trial_order(spec: LoadSpec) -> list[tuple[int, int]]:
    """(concurrency, trial) in execution order. `interleaved`: 1,4,16,32,1,4,16,32,... so slow drift spreads
    over every level; `shuffled`: each round in a seeded random order; `blocked`: level by level."""
    levels = list(dict.fromkeys(spec.concurrencies))
    if spec.order == "blocked":
        return [(c, t) for c in levels for t in range(spec.trials)]
    if spec.order == "shuffled":
        rng = np.random.default_rng([spec.seed, 0x5E])
        return [(levels[i], t) for t in range(spec.trials) for i in rng.permutation(len(levels))]
    return [(c, t) for t in range(spec.trials) for c in levels]


def poisson_offsets(n: int, rate: float, rng: np.random.Generator) -> list[int]:
    """Arrival times (ns after the start) of `n` requests at `rate` per second; the first arrives at 0."""
    if n <= 0:
        return []
    gaps = rng.exponential(1.0 / rate, n - 1)
    return [0, *(int(x) for x in np.cumsum(gaps) * 1e9)]


async def closed_loop(
    send: Send, n: int, concurrency: int, *, clock: Clock, on_done: OnDone, start_ns: int | None = None
) -> None:
    """`n` requests with `concurrency` in flight: each lane sends its next request the moment its previous one
    ends. The first `concurrency` requests are due at the start; a later one is due when the request before it
    on its lane ended, so `sent - scheduled` is the client's own delay."""
    start = clock() if start_ns is None else start_ns
    next_index = 0

    async def lane() -> None:
        nonlocal next_index
        due = start
        while next_index < n:
            i = next_index
            next_index += 1
            rec = await send(i, due)
            on_done(rec)
            if rec.error_kind is ErrorKind.CANCELLED:
                return
            due = rec.end_ns

    await supervise([lane() for _ in range(min(concurrency, n))])


async def open_loop(
    send: Send,
    offsets_ns: Sequence[int],
    cap: int,
    *,
    clock: Clock,
    on_done: OnDone,
    sleep: Sleep = asyncio.sleep,
    start_ns: int | None = None,
) -> None:
    """Requests due at `start + offsets_ns[i]`, sent then unless `cap` are already in flight (then as soon as
    one ends; the wait shows as `sent - scheduled`)."""
    start = clock() if start_ns is None else start_ns
    slots = asyncio.Semaphore(cap)
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int, due: int) -> None:
        try:
            on_done(await send(i, due))
        finally:
            slots.release()

    failures: list[BaseException] = []

    def noticed(t: asyncio.Task[None]) -> None:
        if not t.cancelled() and t.exception() is not None:
            failures.append(t.exception())  # type: ignore[arg-type]

    try:
        for i, off in enumerate(offsets_ns):
            due = start + off
            wait_ns = due - clock()
            if wait_ns > 0:
                await sleep(wait_ns / 1e9)
            await slots.acquire()
            if failures:
                raise failures[0]
            task = asyncio.ensure_future(one(i, due))
            task.add_done_callback(noticed)
            tasks.append(task)
        await asyncio.gather(*tasks)
    except BaseException:
        await _cancel_all(tasks)
        raise


async def supervise(coros: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run coroutines as tasks until all end. If one fails, or this is cancelled, the others are cancelled and
    awaited (each in-flight request then reports itself as cancelled) before the exception propagates."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        await _cancel_all(tasks)
        raise
    if pending:
        await _cancel_all(list(pending))
    for t in done:
        t.result()


async def _cancel_all(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for t in tasks:
        t.cancel()
    # Shielded from a second cancel so the tasks' final records are always collected.
    await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))


def steady_window(records: Sequence[RequestRecord], concurrency: int) -> tuple[int, int] | None:
    """The closed loop's steady state: from the send that first filled every lane to the last send (after it,
    the loop drains). None when there is no such stretch (fewer than 2*C requests)."""
    sends = sorted(r.sent_ns for r in records)
    if concurrency < 1 or len(sends) < 2 * concurrency:
        return None
    lo, hi = sends[concurrency - 1], sends[-1]
    return (lo, hi) if hi > lo else None


def achieved_concurrency(records: Sequence[RequestRecord], start_ns: int, end_ns: int) -> float | None:
    """Time-weighted mean of requests in flight (sent .. end) over [start_ns, end_ns]."""
    span = end_ns - start_ns
    if span <= 0:
        return None
    busy = sum(max(0, min(r.end_ns, end_ns) - max(r.sent_ns, start_ns)) for r in records)
    return busy / span
