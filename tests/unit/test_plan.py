"""Plans: YAML/TOML parsing, defaults, and errors that name the field path and the fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tokbench.config import Plan, ServerSpec, load_plan, plan_from_dict
from tokbench.errors import ConfigError

GOOD = """\
name: seed
configs:
  - name: base
    engine: sglang
    port: 30000
    argv: [python, -m, sglang.launch_server, --port, "30000"]
  - name: nextn
    engine: sglang
    argv: [python, -m, sglang.launch_server, --port, "{port}", --speculative-algorithm, NEXTN]
    env: {SGLANG_ENABLE_SPEC_V2: 1}
    ready_marker: "The server is fired up and ready to roll!"
sweep:
  concurrencies: "1,4,16,32"
  max_tokens: 256
trials: 3
"""


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error(data: object) -> str:
    with pytest.raises(ConfigError) as e:
        plan_from_dict(data)
    return str(e.value)


def test_good_plan(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, GOOD))
    assert [c.name for c in plan.configs] == ["base", "nextn"]
    assert plan.baseline.name == "base"  # the first, when none is marked
    assert plan.design == "interleaved" and plan.rounds == 3
    base, nextn = plan.configs
    assert base.port == 30000 and nextn.port is None  # {port}: picked per launch
    assert nextn.env == {"SGLANG_ENABLE_SPEC_V2": "1"}  # YAML's int became the string the env holds
    spec = plan.load_spec("http://127.0.0.1:30000")
    assert spec.concurrencies == (1, 4, 16, 32) and spec.trials == 3 and spec.max_tokens == 256


def test_port_is_read_from_argv_when_not_given() -> None:
    s = ServerSpec(name="a", argv=["llama-server", "--port", "8080"])
    assert s.port == 8080


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_toml_plan(tmp_path: Path) -> None:
    text = """
design = "blocked"
[[configs]]
name = "a"
argv = ["x", "--port", "{port}"]
baseline = true
[[configs]]
name = "b"
argv = ["y", "--port", "{port}"]
[sweep]
concurrencies = [1, 2]
"""
    plan = load_plan(write(tmp_path, text, "plan.toml"))
    assert plan.design == "blocked" and plan.baseline.name == "a"


def test_errors_name_the_field_path_and_a_fix() -> None:
    msg = error(
        {
            "configs": [
                {"name": "base", "argv": ["x", "--port", "{port}"]},
                {"name": "nextn", "argv": "python -m sglang.launch_server", "port": 8081},
                {"name": "bad name", "argv": ["x", "--port", "{port}"], "portt": 1},
            ],
            "sweep": {"max_tokens": 0},
        }
    )
    assert "configs[1].argv: argv must be a list of arguments" in msg and "shell: true" in msg
    assert "configs[2].name: 'bad name' cannot name files" in msg
    assert "configs[2].portt: Extra inputs are not permitted (remove it or check its spelling" in msg
    assert "known keys: name, engine, argv" in msg
    assert "sweep.max_tokens: Input should be greater than or equal to 1" in msg


def test_missing_port_says_how_to_give_one() -> None:
    msg = error({"configs": [{"name": "a", "argv": ["llama-server", "-m", "x.gguf"]}]})
    assert "configs[0].port: no port" in msg and "'{port}'" in msg


def test_port_must_agree_with_argv() -> None:
    msg = error({"configs": [{"name": "a", "port": 8080, "argv": ["llama-server", "--port", "8081"]}]})
    assert "configs[0].port: 8080 but argv passes --port 8081" in msg


def test_exactly_one_baseline() -> None:
    c = {"argv": ["x", "--port", "{port}"], "baseline": True}
    msg = error({"configs": [{"name": "a", **c}, {"name": "b", **c}]})
    assert "configs[1].baseline: only one configuration can be the baseline" in msg
    a = ServerSpec(name="a", argv=["x", "{port}"])
    b = ServerSpec(name="b", argv=["y", "{port}"], baseline=True)
    plan = Plan(configs=[a, b])
    assert plan.baseline.name == "b"


def test_duplicate_names_and_empty_configs() -> None:
    c = {"argv": ["x", "--port", "{port}"]}
    assert "configs[1].name: 'a' is already the name of configs[0]" in error(
        {"configs": [{"name": "a", **c}, {"name": "a", **c}]}
    )
    assert "configs:" in error({"configs": []})
    assert "configs: Field required (add it)" in error({"sweep": {}})


def test_sweep_cannot_set_base_url_and_trials_must_agree() -> None:
    c = [{"name": "a", "argv": ["x", "--port", "{port}"]}]
    assert "sweep.base_url: not allowed in a plan" in error({"configs": c, "sweep": {"base_url": "http://x"}})
    assert "trials: 3 but sweep.trials is 2" in error({"configs": c, "sweep": {"trials": 2}, "trials": 3})
    assert "engine: Input should be 'sglang', 'vllm', 'llamacpp' or 'generic'" in error(
        {"configs": [{**c[0], "engine": "tgi"}]}
    )


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_plan(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 3, column 4"):
        load_plan(write(tmp_path, "configs:\n  - name: a\n   argv: [x]\n"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_plan(write(tmp_path, "- just\n- a list\n"))
