"""Per-engine facts, resolved-configuration diffs (sglang #39515), flag changes, logged vLLM arguments."""

from __future__ import annotations

from tokbench.server.engines import (
    ENGINES,
    changed_flags,
    config_diff,
    engine_version,
    environment,
    flatten,
    logged_vllm_args,
)

BASE_ARGV = [
    "python", "-m", "sglang.launch_server", "--model-path", "/m/q", "--port", "30000",
    "--attention-backend", "trtllm_mha", "--page-size", "64",
]  # fmt: skip
NEXTN_ARGV = [*BASE_ARGV[:6], "30001", *BASE_ARGV[7:], "--speculative-algorithm", "NEXTN"]


def server_info(**over: object) -> dict[str, object]:
    info: dict[str, object] = {
        "model_path": "/m/q",
        "port": 30000,
        "attention_backend": "trtllm_mha",
        "page_size": 64,
        "speculative_algorithm": None,
        "speculative_num_steps": None,
        "cuda_graph_bs": [1, 2, 4, 8],
        "random_seed": 123,
        "internal_states": [{"avg_spec_accept_length": 1.0, "last_gen_throughput": 171.9}],
        "version": "0.5.10",
    }
    info.update(over)
    return {"server_info": info}


def test_engine_facts() -> None:
    assert ENGINES["sglang"].health_paths == ("/health_generate", "/health")
    assert ENGINES["vllm"].health_paths == ("/v1/models",)
    assert ENGINES["llamacpp"].health_paths == ("/health",)
    assert ENGINES["llamacpp"].config_paths == ("/props", "/slots")
    assert ENGINES["sglang"].config_paths[0] == "/get_server_info"
    assert all(f.metrics_path == "/metrics" for f in ENGINES.values())


def test_flatten() -> None:
    flat = flatten({"a": {"b": 1, "l": [1, 2]}, "s": [{"x": 1}, {"x": 2}]})
    assert flat == {"a.b": 1, "a.l": [1, 2], "s[0].x": 1, "s[1].x": 2}


def test_changed_flags_ignores_port_and_sees_env() -> None:
    flags = changed_flags(BASE_ARGV, NEXTN_ARGV, {}, {"SGLANG_ENABLE_SPEC_V2": "1"})
    assert flags == ["--speculative-algorithm", "SGLANG_ENABLE_SPEC_V2"]


def test_silent_backend_switch_is_flagged_as_unexplained() -> None:
    # sglang #39515: enabling NEXTN switched attention_backend trtllm_mha -> triton and page_size 64 -> 1
    a = server_info()
    b = server_info(
        port=30001,
        attention_backend="triton",
        page_size=1,
        speculative_algorithm="EAGLE",
        speculative_num_steps=3,
        random_seed=987,
        internal_states=[{"avg_spec_accept_length": 1.8, "last_gen_throughput": 172.0}],
    )
    diffs = {d.key: d for d in config_diff(a, b, changed_flags(BASE_ARGV, NEXTN_ARGV))}
    assert set(diffs) == {
        "server_info.attention_backend",
        "server_info.page_size",
        "server_info.speculative_algorithm",
        "server_info.speculative_num_steps",
    }  # port, seed and live counters are not configuration
    assert not diffs["server_info.attention_backend"].expected
    assert not diffs["server_info.page_size"].expected
    assert diffs["server_info.speculative_algorithm"].expected  # the flag the plan changed
    assert diffs["server_info.speculative_num_steps"].expected  # chosen by SGLang for that flag
    assert str(diffs["server_info.attention_backend"]) == "server_info.attention_backend: trtllm_mha → triton"
    assert str(diffs["server_info.page_size"]) == "server_info.page_size: 64 → 1"


def test_short_flags_explain_their_own_settings_only() -> None:
    # llama-server -c 4096 -> 8192 changes n_ctx; as a substring "c" would also have excused attention_backend
    a = {"props": {"n_ctx": 4096, "attention_backend": "cpu", "cache_type_k": "f16"}}
    b = {"props": {"n_ctx": 8192, "attention_backend": "blas", "cache_type_k": "q8_0"}}
    flags = changed_flags(["llama-server", "-c", "4096"], ["llama-server", "-c", "8192"])
    assert flags == ["-c"]
    diffs = {d.key: d.expected for d in config_diff(a, b, flags)}
    assert diffs == {"props.n_ctx": True, "props.attention_backend": False, "props.cache_type_k": False}


def test_identical_configurations_have_no_diff() -> None:
    assert config_diff(server_info(), server_info(port=1, random_seed=2), []) == []


def test_llamacpp_per_launch_values_are_not_configuration() -> None:
    def props(marker: str, seed: int, n_ctx: int) -> dict[str, object]:
        return {"props": {"media_marker": marker, "default_generation_settings": {
            "n_ctx": n_ctx, "params": {"seed": seed, "top_k": 40}}}}  # fmt: skip

    assert config_diff(props("<__media_a__>", 1, 4096), props("<__media_b__>", 2, 4096), []) == []
    (d,) = config_diff(props("<__media_a__>", 1, 4096), props("<__media_b__>", 2, 2048), ["--spec-type"])
    assert d.key == "props.default_generation_settings.n_ctx" and not d.expected


def test_a_setting_present_on_one_side_only() -> None:
    (d,) = config_diff({"x": {"a": 1}}, {"x": {"a": 1, "enable_mixed_chunk": False}}, [])
    assert d.key == "x.enable_mixed_chunk" and not d.expected
    assert str(d) == "x.enable_mixed_chunk: (absent) → false"


def test_vllm_logged_args() -> None:
    log = (
        "INFO 05-01 api_server.py:1 vLLM API server version 0.11.0\n"
        "INFO 05-01 utils.py:2 non-default args: {'model': '/m/Qwen3-8B', 'speculative_config': "
        "{'method': 'ngram', 'num_speculative_tokens': 4}, 'port': 8000}\n"
    )
    args = logged_vllm_args(log)
    assert args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4}
    assert engine_version("vllm", {}, log) == "0.11.0"
    assert logged_vllm_args("nothing here") == {}


def test_engine_versions_from_resolved() -> None:
    assert engine_version("sglang", server_info()) == "0.5.10"
    assert engine_version("llamacpp", {"props": {"build_info": "b6000-abc"}}) == "b6000-abc"
    assert engine_version("generic", {"models": {}}) is None


def test_environment_has_the_basics() -> None:
    env = environment()
    assert env["tokbench_version"] and env["python"] and env["host"] and env["cpu"]
    assert isinstance(env["gpus"], list)
