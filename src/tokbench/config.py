"""Validated, immutable specifications: what to measure (LoadSpec). Parsed from CLI values or plan files.

The campaign issue extends this module with ServerSpec and Plan. Secrets never live here: only the *name* of the
environment variable that holds an API key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tokbench.errors import ConfigError

Api = Literal["chat", "completions", "sglang"]
Order = Literal["interleaved", "shuffled", "blocked"]


class LoadSpec(BaseModel):
    """One sweep: concurrency levels × trials of N requests each, with the request body options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    api: Api = "chat"
    model: str | None = None  # None: the first id from /v1/models
    concurrencies: tuple[int, ...] = (1, 4, 16, 32)
    requests: int | None = Field(default=None, ge=1)  # per trial; None: max(4, 2*C) as in the seed
    warmup: int = Field(default=2, ge=0)  # requests before the first measured trial, excluded from figures
    trials: int = Field(default=1, ge=1)
    order: Order = "interleaved"
    max_tokens: int = Field(default=1000, ge=1)
    ignore_eos: bool = True
    min_tokens: int | None = Field(default=None, ge=0)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    request_seed: int | None = None  # the body's `seed`
    extra_body: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0  # workload and schedule randomness
    prompts: str = "builtin"  # "builtin" or a path to a JSONL / ShareGPT file
    prompt_format: Literal["auto", "jsonl", "sharegpt"] = "auto"
    same_prompts: bool = False
    request_rate: float | None = Field(default=None, gt=0.0)  # open loop (Poisson) when set
    timeout_s: float = Field(default=600.0, gt=0.0)
    stall_timeout_s: float = Field(default=60.0, gt=0.0)
    api_key_env: str | None = None
    lag_threshold_ms: float = Field(default=50.0, gt=0.0)  # event-loop lag p99 above this: client-limited
    label: str = ""

    @field_validator("concurrencies")
    @classmethod
    def _positive_levels(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(c < 1 for c in v):
            raise ValueError("concurrency levels must be positive integers, e.g. 1,4,16,32")
        return v

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not an http(s) URL, e.g. http://127.0.0.1:8080")
        return v.rstrip("/")

    def requests_for(self, concurrency: int) -> int:
        return self.requests if self.requests is not None else max(4, 2 * concurrency)


def parse_levels(text: str, flag: str = "-c/--concurrency") -> tuple[int, ...]:
    """'1,4,16,32' -> (1, 4, 16, 32), with an error that names the flag."""
    try:
        levels = tuple(int(p) for p in text.replace(" ", "").split(",") if p)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a comma-separated list of integers, e.g. 1,4,16,32") from None
    if not levels or any(c < 1 for c in levels):
        raise ConfigError(f"{flag}: levels must be positive integers, e.g. 1,4,16,32")
    return levels


def load_spec(**values: Any) -> LoadSpec:
    """Build a LoadSpec, turning pydantic's errors into one ConfigError that names each field."""
    try:
        return LoadSpec(**values)
    except ValidationError as e:
        raise ConfigError(validation_message(e, "load")) from None


def validation_message(e: ValidationError, where: str) -> str:
    lines = [f"invalid {where} settings:"]
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or where
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)
