"""ServerConfig: every knob of the reference server, validated once, and parsers for the compound CLI flags.

Errors name the flag (`--fault-rate`, `--spec-accept`, ...) so a bad test setup says what to fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tokbench.errors import ConfigError

Personality = Literal["openai", "sglang", "vllm", "llamacpp"]
PERSONALITIES: tuple[str, ...] = ("openai", "sglang", "vllm", "llamacpp")
FAULT_KINDS: tuple[str, ...] = ("http_500", "http_429", "disconnect", "stall", "malformed", "error_event")


@dataclass(frozen=True)
class ServerConfig:
    """How the reference server behaves. Times are milliseconds unless the name says `_s`.

    Decode step time for a batch of n active requests is
    `itl_ms * (1 + batch_slope * (n - 1)) / (speed * run_multiplier)`, times `spec_step_cost *
    (1 + spec_cost_slope * (n - 1))` when speculating. `run_multiplier` is drawn once per server from a seeded
    lognormal with coefficient of variation `noise` (run-to-run noise).
    """

    host: str = "127.0.0.1"
    port: int = 0
    model: str = "tokbench-reference"
    personality: Personality = "openai"
    # timing
    ttft_ms: float = 20.0  # prefill time of an empty prompt
    prefill_ms_per_token: float = 0.0  # extra prefill time per prompt token
    itl_ms: float = 5.0  # one decode step with one request in the batch
    batch_slope: float = 0.03  # relative step-time growth per extra request in the batch
    max_batch: int = 256  # requests beyond this wait for a slot (their queueing is part of TTFT)
    tokens_per_chunk: int = 1  # tokens flushed per SSE chunk after the first (which is sent alone)
    speed: float = 1.0
    noise: float = 0.0  # run-to-run CV of the speed
    step_jitter: float = 0.0  # per-step CV of the step time
    seed: int = 0
    # text
    natural_max: int = 600  # without ignore_eos a prompt "naturally" stops after 1..natural_max tokens
    diverge_at: int | None = None  # tokens at or after this position differ from every other server's text
    # faults
    faults: Mapping[str, float] = field(default_factory=dict)  # kind -> probability per request
    stall_s: float = 300.0  # how long a `stall` fault stops sending
    die_after: int | None = None  # exit after this many finished generation requests
    hard_exit: bool = False  # die_after uses os._exit (subprocess mode); in-process it aborts connections
    fail_start: str | None = None  # used by the CLI only: crash at start with this AssertionError
    load_time_s: float = 0.0  # health endpoints answer 503 "Loading model" this long after start
    # speculative decoding
    spec_accept: tuple[float, ...] = ()  # per-position conditional acceptance; k = len; () = no speculation
    spec_step_cost: float = 1.0  # one speculative step costs this many plain steps
    spec_cost_slope: float = 0.0  # extra relative spec cost per extra request in the batch (erosion)
    spec_request_metrics: bool = False  # vllm: `metrics.speculative_decoding` per response, as vLLM's
    # --per-request-spec-decode-metrics summary adds it to the last event
    # output
    timeline_out: str | None = None  # JSONL of the timeline, written when the server stops

    def __post_init__(self) -> None:
        positive = {
            "--itl-ms": self.itl_ms,
            "--speed": self.speed,
            "--spec-step-cost": self.spec_step_cost,
        }
        for flag, v in positive.items():
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{flag}: must be a positive number, got {v!r}")
        non_negative = {
            "--ttft-ms": self.ttft_ms,
            "--prefill-ms-per-token": self.prefill_ms_per_token,
            "--batch-slope": self.batch_slope,
            "--noise": self.noise,
            "--step-jitter": self.step_jitter,
            "--stall-s": self.stall_s,
            "--load-time-s": self.load_time_s,
            "--spec-cost-slope": self.spec_cost_slope,
        }
        for flag, v in non_negative.items():
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"{flag}: must be zero or a positive number, got {v!r}")
        for flag, n in {
            "--max-batch": self.max_batch,
            "--tokens-per-chunk": self.tokens_per_chunk,
            "--natural-max": self.natural_max,
        }.items():
            if n < 1:
                raise ConfigError(f"{flag}: must be a positive integer, got {n!r}")
        if self.personality not in PERSONALITIES:
            raise ConfigError(f"--personality: {self.personality!r} is not one of {', '.join(PERSONALITIES)}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port: {self.port} is not a TCP port (0 picks a free one)")
        if self.die_after is not None and self.die_after < 1:
            raise ConfigError(f"--die-after: must be at least 1, got {self.die_after}")
        if self.diverge_at is not None and self.diverge_at < 0:
            raise ConfigError(f"--diverge-at: must be a token position >= 0, got {self.diverge_at}")
        for kind, rate in self.faults.items():
            if kind not in FAULT_KINDS:
                raise ConfigError(f"--fault-rate: unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
            if not 0 <= rate <= 1:
                raise ConfigError(f"--fault-rate: {kind}={rate} is not a probability in [0, 1]")
        if sum(self.faults.values()) > 1 + 1e-9:
            raise ConfigError(
                "--fault-rate: the rates add up to more than 1; each request gets at most one fault"
            )
        if self.spec_request_metrics and self.personality != "vllm":
            raise ConfigError("--per-request-spec-decode-metrics: only the vllm personality reports them")
        for p in self.spec_accept:
            if not 0 <= p <= 1:
                raise ConfigError(f"--spec-accept: {p} is not a probability in [0, 1]")

    @property
    def spec_k(self) -> int:
        return len(self.spec_accept)

    @property
    def mean_accepted_length(self) -> float:
        """L = 1 + sum_i prod_{j<=i} p_j: tokens per verify step, bonus token included (1 without spec)."""
        total, run = 1.0, 1.0
        for p in self.spec_accept:
            run *= p
            total += run
        return total


def parse_fault_rates(values: list[str] | tuple[str, ...]) -> dict[str, float]:
    """['disconnect=0.1', 'stall=0.05'] -> {'disconnect': 0.1, 'stall': 0.05}; comma-separated works too."""
    out: dict[str, float] = {}
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            kind, sep, rate = part.partition("=")
            kind = kind.strip()
            if not sep:
                raise ConfigError(f"--fault-rate: {part!r} should look like KIND=RATE, e.g. disconnect=0.1")
            if kind not in FAULT_KINDS:
                raise ConfigError(f"--fault-rate: unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
            try:
                out[kind] = float(rate)
            except ValueError:
                raise ConfigError(f"--fault-rate: {rate!r} in {part!r} is not a number") from None
    return out


def parse_accept(text: str) -> tuple[float, ...]:
    """'0.8,0.6,0.4' -> (0.8, 0.6, 0.4); empty text turns speculation off."""
    try:
        probs = tuple(float(p) for p in text.replace(" ", "").split(",") if p)
    except ValueError:
        raise ConfigError(
            f"--spec-accept: {text!r} is not a comma-separated list of probabilities, e.g. 0.8,0.6,0.4"
        ) from None
    for p in probs:
        if not 0 <= p <= 1:
            raise ConfigError(f"--spec-accept: {p} is not a probability in [0, 1]")
    return probs
