"""Every preflight rule: it fires on the conflicting command line, its message names the flag, the engine's
own error and the fix, and a near-identical command line without the conflict passes."""

from __future__ import annotations

import pytest

from tokbench.config import Plan, ServerSpec
from tokbench.errors import PreflightError
from tokbench.server.preflight import RULES, Argv, preflight, preflight_plan

SGL = ["python", "-m", "sglang.launch_server", "--model-path", "/m/Llama-3.1-8B", "--port", "30000"]
QWEN35 = [
    "python",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "/m/Qwen3.5-397B-A17B-NVFP4",
    "--port",
    "30000",
]
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"]
LCPP = ["llama-server", "-m", "/m/gemma.gguf", "--port", "8080"]
VLLM = ["vllm", "serve", "/m/Qwen3-8B", "--port", "8000"]


def spec(engine: str, argv: list[str], env: dict[str, str] | None = None, name: str = "cfg") -> ServerSpec:
    return ServerSpec(name=name, engine=engine, argv=argv, env=env or {})  # type: ignore[arg-type]


def ids(s: ServerSpec) -> list[str]:
    return [f.rule.id for f in preflight(s, environ={})]


# (rule id, engine, conflicting argv, env, fixed argv, fixed env, text the finding must name)
CASES = [
    (
        "sglang-spec-v2-topk",
        "sglang",
        [*SGL, *EAGLE, "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"],
        {"SGLANG_ENABLE_SPEC_V2": "1"},
        [*SGL, *EAGLE, "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
        {"SGLANG_ENABLE_SPEC_V2": "1"},
        "--speculative-eagle-topk 4 with SGLANG_ENABLE_SPEC_V2=1",
    ),
    (
        "sglang-topk-without-steps",
        "sglang",
        [*SGL, "--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "2",
         "--speculative-eagle-topk", "1"],
        {},
        [*SGL, "--speculative-algorithm", "NEXTN"],
        {},
        "--speculative-num-draft-tokens 2",
    ),
    (
        "sglang-trtllm-mha-topk",
        "sglang",
        [*SGL, *EAGLE, "--speculative-eagle-topk", "2", "--attention-backend", "trtllm_mha"],
        {},
        [*SGL, *EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "trtllm_mha"],
        {},
        "--attention-backend trtllm_mha",
    ),
    (
        "sglang-topk-page-size",
        "sglang",
        [*SGL, *EAGLE, "--speculative-eagle-topk", "2", "--page-size", "64",
         "--attention-backend", "flashmla"],
        {},
        [*SGL, *EAGLE, "--speculative-eagle-topk", "2", "--page-size", "64", "--attention-backend",
         "flashinfer"],
        {},
        "--page-size 64",
    ),
    (
        "sglang-topk-page-size-backend",
        "sglang",
        [*SGL, *EAGLE, "--speculative-eagle-topk", "2", "--page-size", "16"],
        {},
        [*SGL, *EAGLE, "--speculative-eagle-topk", "2", "--page-size", "1"],
        {},
        "--page-size 16",
    ),
    (
        "sglang-hybrid-extra-buffer",
        "sglang",
        [*QWEN35, "--speculative-algo", "NEXTN"],
        {"SGLANG_ENABLE_SPEC_V2": "1"},
        [*QWEN35, "--speculative-algo", "NEXTN", "--mamba-scheduler-strategy", "extra_buffer"],
        {"SGLANG_ENABLE_SPEC_V2": "1"},
        "Qwen3.5-397B-A17B-NVFP4",
    ),
    (
        "sglang-standalone-dp-attention",
        "sglang",
        [*SGL, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/m/d",
         "--enable-dp-attention"],
        {},
        [*SGL, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/m/d"],
        {},
        "--enable-dp-attention",
    ),
    (
        "sglang-ngram-dp-attention",
        "sglang",
        [*SGL, "--speculative-algorithm", "NGRAM", "--enable-dp-attention"],
        {},
        [*SGL, "--speculative-algorithm", "NGRAM"],
        {},
        "--enable-dp-attention",
    ),
    (
        "llamacpp-draft-without-spec-type",
        "llamacpp",
        [*LCPP, "-md", "/m/gemma.gguf"],
        {},
        [*LCPP, "-md", "/m/gemma.gguf", "--spec-type", "draft-simple"],
        {},
        "-md without --spec-type",
    ),
    (
        "vllm-speculative-config-json",
        "vllm",
        [*VLLM, "--speculative-config", "{method: ngram}"],
        {},
        [*VLLM, "--speculative-config", '{"method": "ngram"}'],
        {},
        "--speculative-config",
    ),
    (
        "vllm-spec-tokens-without-model",
        "vllm",
        [*VLLM, "--speculative-config", '{"num_speculative_tokens": 3}'],
        {},
        [*VLLM, "--speculative-config", '{"model": "/m/eagle3", "num_speculative_tokens": 3}'],
        {},
        "num_speculative_tokens=3",
    ),
    (
        "vllm-prompt-lookup-order",
        "vllm",
        [*VLLM, "--speculative-config",
         '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}'],
        {},
        [*VLLM, "--speculative-config",
         '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'],
        {},
        "prompt_lookup_min=5 > prompt_lookup_max=2",
    ),
]  # fmt: skip


def test_every_rule_has_a_case() -> None:
    assert {r.id for r in RULES} == {c[0] for c in CASES}


@pytest.mark.parametrize(("rule_id", "engine", "bad", "bad_env", "good", "good_env", "named"), CASES)
def test_rule_fires_names_flag_error_and_fix(
    rule_id: str,
    engine: str,
    bad: list[str],
    bad_env: dict[str, str],
    good: list[str],
    good_env: dict[str, str],
    named: str,
) -> None:
    findings = [
        f for f in preflight(spec(engine, bad, bad_env, name="nextn"), environ={}) if f.rule.id == rule_id
    ]
    assert len(findings) == 1
    f = findings[0]
    text = str(f)
    assert text.startswith("nextn: ")  # the configuration
    assert named in f.found and named in text  # what on its command line conflicts
    assert f.rule.flag in text  # the flag
    assert f.rule.message in text  # the engine's own error
    assert "fix: " + f.rule.fix in text  # and the fix
    assert f.rule.fix.strip() and any(
        tok.startswith("-") or "=" in tok or '"' in tok for tok in f.rule.fix.split()
    )
    assert rule_id not in ids(spec(engine, good, good_env))


def test_engine_errors_are_quoted_verbatim() -> None:
    by_id = {r.id: r for r in RULES}
    assert by_id["sglang-spec-v2-topk"].message.endswith(
        "Spec v2 currently only supports topk = 1 for speculative decoding."
    )
    assert "num_speculative_tokens was provided but without speculative model." in (
        by_id["vllm-spec-tokens-without-model"].message
    )
    assert "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1." in (
        by_id["sglang-hybrid-extra-buffer"].message
    )


def test_rules_only_apply_to_their_engine() -> None:
    # the same SGLang conflict under another engine name is not checked by SGLang's rules
    argv = [*SGL, *EAGLE, "--speculative-eagle-topk", "4"]
    assert ids(spec("sglang", argv, {"SGLANG_ENABLE_SPEC_V2": "1"})) == ["sglang-spec-v2-topk"]
    assert ids(spec("generic", argv, {"SGLANG_ENABLE_SPEC_V2": "1"})) == []


def test_plain_configurations_pass() -> None:
    assert ids(spec("sglang", SGL)) == []
    assert ids(spec("sglang", [*QWEN35, "--tp-size", "8"])) == []  # hybrid model, no speculation
    assert ids(spec("llamacpp", [*LCPP, "--spec-type", "ngram-simple"])) == []
    assert (
        ids(spec("vllm", [*VLLM, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']))
        == []
    )
    assert (
        ids(spec("vllm", [*VLLM, "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']))
        == []
    )


def test_draft_tree_rules_apply_to_the_eagle_family_only() -> None:
    # SGLang runs its topk / num_steps / tree-backend checks in the EAGLE branch (NEXTN becomes EAGLE first);
    # NGRAM has its own, where --speculative-num-draft-tokens without --speculative-num-steps is normal
    ngram = [*SGL, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"]
    assert ids(spec("sglang", ngram)) == []
    assert (
        ids(spec("sglang", [*ngram, "--speculative-eagle-topk", "4", "--attention-backend", "trtllm_mha"]))
        == []
    )
    nextn = [*SGL, "--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "8"]
    assert ids(spec("sglang", nextn)) == ["sglang-topk-without-steps"]


def test_llamacpp_flags_set_through_the_environment_count() -> None:
    # llama-server reads LLAMA_ARG_* for every flag: a draft set there without a type is the same trap,
    # and a type set there is a type
    assert ids(spec("llamacpp", LCPP, {"LLAMA_ARG_SPEC_DRAFT_MODEL": "/m/d.gguf"})) == [
        "llamacpp-draft-without-spec-type"
    ]
    typed = {"LLAMA_ARG_SPEC_DRAFT_MODEL": "/m/d.gguf", "LLAMA_ARG_SPEC_TYPE": "draft-simple"}
    assert ids(spec("llamacpp", LCPP, typed)) == []
    assert ids(spec("llamacpp", [*LCPP, "-md", "/m/d.gguf"], {"LLAMA_ARG_SPEC_TYPE": "draft-simple"})) == []


def test_spec_v2_only_when_the_environment_enables_it() -> None:
    argv = [*SGL, *EAGLE, "--speculative-eagle-topk", "4"]
    assert ids(spec("sglang", argv, {"SGLANG_ENABLE_SPEC_V2": "0"})) == []
    assert ids(spec("sglang", argv, {"SGLANG_ENABLE_SPEC_V2": "true"})) == ["sglang-spec-v2-topk"]
    # inherited from the environment tokbench runs in, as the server would inherit it
    s = spec("sglang", argv)
    assert [f.rule.id for f in preflight(s, environ={"SGLANG_ENABLE_SPEC_V2": "1"})] == [
        "sglang-spec-v2-topk"
    ]


def test_argv_reads_like_argparse() -> None:
    a = Argv(("--page-size=16", "--speculative_eagle_topk", "2", "--speculative-algo", "EAGLE", "--flag"), {},
             ("--speculative-algorithm", "--speculative-eagle-topk", "--page-size"))  # fmt: skip
    assert a.int_value("--page-size") == 16
    assert a.int_value("--speculative-eagle-topk") == 2  # underscores spelled as dashes
    assert a.value("--speculative-algorithm") == "EAGLE"  # an unambiguous abbreviation
    assert a.has("--flag") and a.value("--flag") is None
    later = Argv(("--page-size", "1", "--page-size", "64"), {})
    assert later.int_value("--page-size") == 64  # last one wins


def test_shell_lines_are_split_for_preflight() -> None:
    s = ServerSpec(
        name="nextn",
        engine="sglang",
        shell=True,
        port=30000,
        argv=["SGLANG_X=1 python -m sglang.launch_server --speculative-algorithm NEXTN "
              "--speculative-eagle-topk 1 --port 30000 2>&1"],
    )  # fmt: skip
    assert ids(s) == ["sglang-topk-without-steps"]


def test_preflight_plan_raises_listing_every_error_and_returns_warnings() -> None:
    plan = Plan(
        configs=[
            ServerSpec(name="base", engine="llamacpp", argv=[*LCPP, "-md", "/m/d.gguf"]),
            ServerSpec(
                name="nextn",
                engine="sglang",
                argv=[*SGL, "--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "2"],
                env={"SGLANG_ENABLE_SPEC_V2": "1"},
            ),
        ]
    )
    with pytest.raises(PreflightError) as e:
        preflight_plan(plan, environ={})
    msg = str(e.value)
    assert "nothing was started" in msg
    assert "nextn: " in msg and "sglang-spec-v2-topk" in msg and "sglang-topk-without-steps" in msg
    assert "llamacpp-draft" not in msg  # a warning is not an error
    ok = Plan(configs=[ServerSpec(name="base", engine="llamacpp", argv=[*LCPP, "-md", "/m/d.gguf"])])
    warnings = preflight_plan(ok, environ={})
    assert [w.rule.id for w in warnings] == ["llamacpp-draft-without-spec-type"]
