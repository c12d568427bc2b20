"""Validated, immutable specifications: what to measure (LoadSpec). Parsed from CLI values or plan files.

ServerSpec and Plan describe campaigns. Secrets never live here: only the *name* of the environment
variable that holds an API key.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

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
        raise ConfigError(
            f"{flag}: {text!r} is not a comma-separated list of integers, e.g. 1,4,16,32"
        ) from None
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


# ---- campaigns: server configurations and plans (CAMPAIGN) -------------------------------------------------

Engine = Literal["sglang", "vllm", "llamacpp", "generic"]
Design = Literal["interleaved", "blocked"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PORT_FLAG = "--port"


def _argv_port(argv: Sequence[str]) -> str | None:
    """The value given to --port in argv (`--port N` or `--port=N`), or None."""
    for i, tok in enumerate(argv):
        if tok == _PORT_FLAG and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(_PORT_FLAG + "="):
            return tok.split("=", 1)[1]
    return None


class ServerSpec(BaseModel):
    """One server configuration of a campaign: how to start it and how to tell it is ready.

    `{port}` and `{host}` in argv and env values are replaced at launch; with no `port`, a free one is picked
    per launch (argv must then pass `{port}` to the server)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    engine: Engine = "generic"
    argv: tuple[str, ...] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535, validate_default=True)
    # a log line (substring) that must appear before the server counts as ready
    ready_marker: str | None = None
    # a path ("/health") or URL that must answer 200; default: the engine's health paths
    ready_url: str | None = None
    baseline: bool = False
    ready_timeout_s: float = Field(default=900.0, gt=0.0)
    shell: bool = False  # run " ".join(argv) through /bin/sh -c; only when the plan asks for it

    @field_validator("name")
    @classmethod
    def _file_safe_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"{v!r} cannot name files; use letters, digits, '.', '_' or '-' (e.g. 'nextn', 'sglang-base')"
            )
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        # YAML reads SGLANG_ENABLE_SPEC_V2: 1 as an int; the process environment only holds strings.
        if isinstance(v, Mapping):
            return {
                str(k): ("" if x is None else str(x).lower() if isinstance(x, bool) else str(x))
                for k, x in v.items()
            }
        return v

    @field_validator("argv", mode="before")
    @classmethod
    def _argv_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(
                "argv must be a list of arguments, e.g. [python, -m, sglang.launch_server, --port, '{port}'];"
                " to run a shell command line, give it as a one-item list and set shell: true"
            )
        if isinstance(v, Sequence):
            return tuple(str(x) for x in v)
        return v

    @field_validator("ready_url")
    @classmethod
    def _url_or_path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("/", "http://", "https://")):
            raise ValueError(f"{v!r} is neither a path ('/health') nor an http(s) URL")
        return v

    @field_validator("port")
    @classmethod
    def _port_agrees(cls, v: int | None, info: ValidationInfo) -> int | None:
        argv: tuple[str, ...] = info.data.get("argv", ())
        given = _argv_port(argv)
        if v is None:
            if given is not None and given.isdigit():
                return int(given)
            if not any("{port}" in a for a in argv):
                raise ValueError(
                    "no port: set `port: 30000` (and pass the same --port in argv), "
                    "or pass '{port}' in argv to let tokbench pick a free port per launch"
                )
            return None
        if given is not None and given.isdigit() and int(given) != v:
            raise ValueError(
                f"{v} but argv passes --port {given}; make them agree, or write --port '{{port}}' in argv"
            )
        return v


class Plan(BaseModel):
    """A campaign: configurations × sweep × trials, and how launches are ordered (interleaved or blocked)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    configs: tuple[ServerSpec, ...] = Field(min_length=1)
    sweep: dict[str, Any] = Field(default_factory=dict)  # LoadSpec fields except base_url
    design: Design = "interleaved"
    alternate: bool = True  # interleaved: reverse the config order every other round (A B, B A, ...)
    trials: int | None = Field(default=None, ge=1)  # rounds; the same as sweep.trials
    metric: str = "agg_tok_s"
    margin_pct: float = Field(default=2.0, gt=0.0)
    stop_grace_s: float = Field(default=10.0, ge=0.0)
    out_dir: str | None = None

    @field_validator("sweep", mode="before")
    @classmethod
    def _sweep_fields(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError(
                "sweep must be a mapping of load settings, e.g. {concurrencies: [1, 4], max_tokens: 256}"
            )
        v = dict(v)
        if "base_url" in v:
            raise ValueError(
                "base_url: not allowed in a plan, as each configuration's URL comes from its host and port;"
                " remove it"
            )
        if isinstance(v.get("concurrencies"), str):
            v["concurrencies"] = parse_levels(v["concurrencies"], "sweep.concurrencies")
        try:
            LoadSpec(base_url="http://127.0.0.1:1", **v)
        except ValidationError as e:
            raise ValueError(
                _SWEEP_SEP.join(
                    f"{_loc(err['loc'])}: {str(err['msg']).removeprefix('Value error, ')}"
                    for err in e.errors()
                )
            ) from None
        return v

    @model_validator(mode="after")
    def _one_baseline(self) -> Plan:
        names: dict[str, int] = {}
        for i, c in enumerate(self.configs):
            if c.name in names:
                raise ValueError(
                    f"configs[{i}].name: {c.name!r} is already the name of configs[{names[c.name]}];"
                    " names must be unique"
                )
            names[c.name] = i
        marked = [i for i, c in enumerate(self.configs) if c.baseline]
        if len(marked) > 1:
            raise ValueError(
                f"configs[{marked[1]}].baseline: only one configuration can be the baseline "
                f"(configs[{marked[0]}] {self.configs[marked[0]].name!r} already is);"
                " remove one `baseline: true`"
            )
        swept = self.sweep.get("trials")
        if self.trials is not None and swept is not None and swept != self.trials:
            raise ValueError(f"trials: {self.trials} but sweep.trials is {swept}; give one of them")
        return self

    @property
    def baseline(self) -> ServerSpec:
        """The configuration every other one is compared against: the one marked, else the first."""
        return next((c for c in self.configs if c.baseline), self.configs[0])

    @property
    def rounds(self) -> int:
        return self.trials or int(self.sweep.get("trials", 1))

    def load_spec(self, base_url: str, **overrides: Any) -> LoadSpec:
        """The sweep as a LoadSpec against one launched server."""
        values = {**self.sweep, "trials": self.rounds, **overrides}
        return LoadSpec(base_url=base_url, **values)


def _loc(loc: Sequence[int | str]) -> str:
    """('configs', 1, 'argv') -> 'configs[1].argv'."""
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


_SWEEP_SEP = "\n"
_FIXES = {
    "missing": "add it",
    "extra_forbidden": "remove it or check its spelling",
}


def plan_from_dict(data: Any, where: str = "plan") -> Plan:
    """Validate a parsed plan; every problem is reported with its field path (configs[1].argv) and a fix."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where}: expected a mapping with 'configs' and 'sweep', got {type(data).__name__}"
        )
    try:
        return Plan(**data)
    except ValidationError as e:
        lines = [f"invalid plan {where}:"]
        for err in e.errors():
            msg = str(err["msg"]).removeprefix("Value error, ")
            fix = _FIXES.get(err["type"], "")
            loc = _loc(err["loc"])
            if loc == "sweep" and err["type"] == "value_error" and ": " in msg:
                # a LoadSpec problem inside the sweep: one line per field, as sweep.<field>
                lines.extend(f"  sweep.{part}" for part in msg.split(_SWEEP_SEP))
                continue
            if err["type"] == "extra_forbidden" and len(err["loc"]) >= 1:
                parent = ServerSpec if err["loc"][0] == "configs" else Plan
                fix += f"; known keys: {', '.join(parent.model_fields)}"
            lines.append(f"  {loc + ': ' if loc else ''}{msg}" + (f" ({fix})" if fix else ""))
        raise ConfigError("\n".join(lines)) from None


def _read_toml(text: str, p: Path) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"plan {p}: not valid TOML: {e}") from None
    raise ConfigError(f"plan {p}: TOML plans need Python 3.11+; write it as YAML instead")


def load_plan(path: str | Path) -> Plan:
    """Read a YAML (or, on Python 3.11+, TOML) plan file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"plan {p}: cannot read it ({e.strerror}); check the path") from None
    data: Any
    if p.suffix.lower() == ".toml":
        data = _read_toml(text, p)
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ConfigError(f"plan {p}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    return plan_from_dict(data, str(p))
