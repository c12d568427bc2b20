"""ServerConfig validation and the CLI's compound-flag parsers: errors name the flag."""

from __future__ import annotations

import pytest

from tokbench.errors import ConfigError
from tokbench.testing import ServerConfig, parse_accept, parse_fault_rates
from tokbench.testing.__main__ import build_parser, config_from_args


def test_fault_rates_parse_repeated_and_comma_separated() -> None:
    assert parse_fault_rates(["disconnect=0.1", "stall=0.05,http_500=0.2"]) == {
        "disconnect": 0.1,
        "stall": 0.05,
        "http_500": 0.2,
    }


@pytest.mark.parametrize("bad", ["disconnect", "explode=0.1", "stall=lots"])
def test_bad_fault_rates_name_the_flag(bad: str) -> None:
    with pytest.raises(ConfigError, match="--fault-rate"):
        parse_fault_rates([bad])


def test_accept_parses_and_rejects_non_probabilities() -> None:
    assert parse_accept("0.8, 0.6,0.4") == (0.8, 0.6, 0.4)
    assert parse_accept("") == ()
    for bad in ("0.8,x", "1.5"):
        with pytest.raises(ConfigError, match="--spec-accept"):
            parse_accept(bad)


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("itl_ms", 0.0, "--itl-ms"),
        ("noise", -0.1, "--noise"),
        ("tokens_per_chunk", 0, "--tokens-per-chunk"),
        ("personality", "tgi", "--personality"),
        ("die_after", 0, "--die-after"),
        ("faults", {"stall": 0.7, "disconnect": 0.7}, "--fault-rate"),
        ("spec_accept", (0.5, 2.0), "--spec-accept"),
        ("spec_request_metrics", True, "--per-request-spec-decode-metrics"),
    ],
)
def test_invalid_config_names_the_flag(field: str, value: object, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        ServerConfig(**{field: value})  # type: ignore[arg-type]


def test_mean_accepted_length_is_one_plus_the_sum_of_cumulative_products() -> None:
    assert ServerConfig().mean_accepted_length == 1.0
    cfg = ServerConfig(spec_accept=(0.5, 0.5))
    assert cfg.spec_k == 2 and cfg.mean_accepted_length == pytest.approx(1 + 0.5 + 0.25)


def test_cli_flags_reach_the_config() -> None:
    ns = build_parser().parse_args(
        ["--port", "0", "--fault-rate", "stall=0.1", "--spec-accept", "0.7,0.2", "--personality", "vllm"]
    )
    cfg = config_from_args(ns)
    assert cfg.faults == {"stall": 0.1} and cfg.spec_accept == (0.7, 0.2) and cfg.personality == "vllm"
    assert cfg.hard_exit  # the process form exits for real on --die-after
