"""The decode-step model: one asyncio task steps a continuous batch, like a batching inference engine.

A request waits for a batch slot (queueing), is prefilled (its first token), then gets tokens at the end of
every decode step it takes part in. A step with n requests takes longer than a step with one, so aggregate
tok/s grows sublinearly with concurrency. With speculation each step drafts k tokens per request, accepts a
prefix with the configured per-position probabilities and emits accepted + 1 tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tokbench.testing.settings import ServerConfig


def lognormal_unit_mean(rng: np.random.Generator, cv: float) -> float:
    """A lognormal draw with mean 1 and coefficient of variation `cv` (1.0 exactly when cv is 0)."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return float(rng.lognormal(-sigma * sigma / 2, sigma))


@dataclass(frozen=True)
class Emission:
    """What one prefill or decode step gave one request."""

    tokens: int
    draft_tokens: int = 0  # k when this step speculated, else 0
    accepted: int = 0  # draft tokens accepted in this step (the accepted prefix length)
    done: bool = False


@dataclass
class SpecCounters:
    """Engine-wide counters since start, as vLLM and llama.cpp export them."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)


@dataclass
class EngineStats:
    """Cumulative since the engine started; the personalities' /metrics read these at scrape time."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    decode_steps: int = 0
    busy_batch_sum: int = 0  # sum over steps of the batch size (mean batch = this / decode_steps)
    decode_seconds: float = 0.0  # modelled time spent in decode steps
    prefill_seconds: float = 0.0
    tokens_max: int = 0  # longest prompt + generation seen
    running: int = 0
    waiting: int = 0
    spec: SpecCounters = field(default_factory=SpecCounters)
    # The last steps as (end time, tokens, drafts, accepted drafts): SGLang's last-interval gauges.
    recent: deque[tuple[float, int, int, int]] = field(default_factory=lambda: deque(maxlen=256))


class Job:
    """One request inside the engine. The HTTP handler reads its emissions in order with `next()`."""

    def __init__(self, target_tokens: int, prompt_tokens: int) -> None:
        self.target_tokens = target_tokens
        self.prompt_tokens = prompt_tokens
        self.generated = 0
        self.cancelled = False
        self._queue: asyncio.Queue[Emission] = asyncio.Queue()

    @property
    def remaining(self) -> int:
        return self.target_tokens - self.generated

    async def next(self) -> Emission:
        return await self._queue.get()

    def _emit(self, e: Emission) -> None:
        self.generated += e.tokens
        self._queue.put_nowait(e)


class DecodeEngine:
    """Continuous batching over `Job`s with the step-time model of `ServerConfig` (see its docstring)."""

    def __init__(
        self,
        cfg: ServerConfig,
        rng: np.random.Generator,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.cfg = cfg
        self._rng = rng
        # Drawn first so that the same seed gives the same run speed whatever else is configured.
        self.run_multiplier = lognormal_unit_mean(rng, cfg.noise)
        self.stats = EngineStats(spec=SpecCounters(per_position=[0] * cfg.spec_k))
        self._clock = clock
        self._waiting: deque[Job] = deque()
        self._prefilling: dict[Job, asyncio.TimerHandle] = {}  # job -> its prefill-done timer
        self._decoding: list[Job] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def effective_speed(self) -> float:
        return self.cfg.speed * self.run_multiplier

    def step_seconds(self, batch: int) -> float:
        """Modelled duration of one decode step with `batch` requests (before per-step jitter)."""
        cfg = self.cfg
        t = cfg.itl_ms / 1000.0 * (1.0 + cfg.batch_slope * (batch - 1)) / self.effective_speed
        if cfg.spec_k:
            t *= cfg.spec_step_cost * (1.0 + cfg.spec_cost_slope * (batch - 1))
        return t

    def prefill_seconds(self, prompt_tokens: int) -> float:
        cfg = self.cfg
        return (cfg.ttft_ms + cfg.prefill_ms_per_token * prompt_tokens) / 1000.0 / self.effective_speed

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tokbench-reference-engine")

    async def close(self) -> None:
        for h in self._prefilling.values():
            h.cancel()
        self._prefilling.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- requests ------------------------------------------------------------------------------------------

    def submit(self, target_tokens: int, prompt_tokens: int) -> Job:
        """Queue a request that will generate exactly `target_tokens` (>= 1) tokens."""
        job = Job(max(1, target_tokens), prompt_tokens)
        self.stats.prompt_tokens += prompt_tokens
        self._waiting.append(job)
        self._admit()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: free the slot. Safe to call for a finished job."""
        if job.cancelled:
            return
        job.cancelled = True
        if job in self._waiting:
            self._waiting.remove(job)
        handle = self._prefilling.pop(job, None)
        if handle is not None:
            handle.cancel()
        if job in self._decoding:
            self._decoding.remove(job)
        self._update_gauges()
        self._admit()

    def _active(self) -> int:
        return len(self._prefilling) + len(self._decoding)

    def _update_gauges(self) -> None:
        self.stats.running = self._active()
        self.stats.waiting = len(self._waiting)

    def _admit(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting and self._active() < self.cfg.max_batch:
            job = self._waiting.popleft()
            delay = self.prefill_seconds(job.prompt_tokens)
            self.stats.prefill_seconds += delay
            self._prefilling[job] = loop.call_later(delay, self._prefilled, job)
        self._update_gauges()

    def _prefilled(self, job: Job) -> None:
        if self._prefilling.pop(job, None) is None:
            return
        # Prefill produces the first token, as in real engines.
        self._finish_or_continue(job, Emission(tokens=1, done=job.target_tokens <= 1))

    def _finish_or_continue(self, job: Job, e: Emission) -> None:
        self.stats.generation_tokens += e.tokens
        job._emit(e)
        if e.done:
            self.stats.requests_finished += 1
            self.stats.tokens_max = max(self.stats.tokens_max, job.prompt_tokens + job.generated)
            if job in self._decoding:
                self._decoding.remove(job)
            self._admit()
        elif job not in self._decoding:
            self._decoding.append(job)
            self._wake.set()
        self._update_gauges()

    # ---- the step loop -------------------------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def _run(self) -> None:
        deadline: float | None = None
        while True:
            if not self._decoding:
                deadline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = list(self._decoding)
            dt = self.step_seconds(len(batch)) * lognormal_unit_mean(self._rng, self.cfg.step_jitter)
            now = self._now()
            # Steps follow each other back to back on absolute deadlines, so sleep overshoot does not
            # accumulate; but a step never shrinks below half its length to catch up (no unrealistic bursts).
            start = now if deadline is None else max(deadline, now - dt / 2)
            deadline = start + dt
            delay = deadline - self._now()
            if delay > 0:
                await asyncio.sleep(delay)
            self.stats.decode_steps += 1
            self.stats.busy_batch_sum += len(batch)
            self.stats.decode_seconds += dt
            tokens = drafts = accepted = 0
            for job in batch:
                if job.cancelled or job not in self._decoding:
                    continue
                e = self._step_one(job)
                tokens += e.tokens
                drafts += 1 if e.draft_tokens else 0
                accepted += e.accepted
                self._finish_or_continue(job, e)
            self.stats.recent.append((self._now(), tokens, drafts, accepted))

    def _step_one(self, job: Job) -> Emission:
        k = self.cfg.spec_k
        if not k:
            return Emission(tokens=1, done=job.remaining <= 1)
        draws = self._rng.random(k)
        accepted = 0
        for i in range(k):
            if draws[i] >= self.cfg.spec_accept[i]:
                break
            accepted += 1
        spec = self.stats.spec
        spec.drafts += 1
        spec.draft_tokens += k
        spec.accepted += accepted
        for i in range(accepted):
            spec.per_position[i] += 1
        # The verify step's accepted tokens plus the bonus token, cut at max_tokens as engines do.
        tokens = min(accepted + 1, job.remaining)
        return Emission(tokens=tokens, draft_tokens=k, accepted=accepted, done=tokens >= job.remaining)
