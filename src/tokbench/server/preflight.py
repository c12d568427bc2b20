"""Preflight: known flag conflicts that make an engine crash at launch (or silently not do what was asked).

Each rule is data: the engine, the flag, the engine's own error text, the fix, where the behaviour comes
from, and a small predicate over the parsed command line. A plan that would crash fails here in about a
second instead of after a model load (../shared/reference/spec-decoding.md section 3).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokbench.config import Plan, ServerSpec
from tokbench.errors import PreflightError

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Argv:
    """A server command line, read the way argparse would: `--f v`, `--f=v`, last one wins, `_` == `-`,
    and (for the Python engines) unambiguous abbreviations such as SGLang's common `--speculative-algo`."""

    tokens: tuple[str, ...]
    env: Mapping[str, str]
    known: tuple[str, ...] = ()  # flags an abbreviation may stand for

    def _spelling(self, tok: str) -> str | None:
        if not tok.startswith("-") or tok == "-" or _NUMBER.match(tok):
            return None
        flag = tok.split("=", 1)[0]
        return flag[:2] + flag[2:].replace("_", "-") if flag.startswith("--") else flag

    def _matches(self, flag: str, names: Sequence[str]) -> bool:
        if flag in names:
            return True
        if len(flag) < 6 or not flag.startswith("--") or flag in self.known:
            return False
        candidates = [k for k in self.known if k.startswith(flag)]
        return len(candidates) == 1 and candidates[0] in names

    def find(self, *names: str) -> tuple[str, str | None] | None:
        """(spelling used, value) of the last occurrence of any of `names`; value None for a bare flag."""
        found: tuple[str, str | None] | None = None
        for i, tok in enumerate(self.tokens):
            flag = self._spelling(tok)
            if flag is None or not self._matches(flag, names):
                continue
            if "=" in tok:
                found = (flag, tok.split("=", 1)[1])
            elif i + 1 < len(self.tokens) and self._spelling(self.tokens[i + 1]) is None:
                found = (flag, self.tokens[i + 1])
            else:
                found = (flag, None)
        return found

    def value(self, *names: str) -> str | None:
        hit = self.find(*names)
        return hit[1] if hit else None

    def has(self, *names: str) -> bool:
        return self.find(*names) is not None

    def int_value(self, *names: str) -> int | None:
        v = self.value(*names)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    def env_on(self, name: str) -> bool:
        return self.env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


_NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class Rule:
    """One known conflict. `check` returns what it found (e.g. "--speculative-eagle-topk 4 with
    SGLANG_ENABLE_SPEC_V2=1"), or None when the command line is fine."""

    id: str
    engine: str
    flag: str
    severity: Severity
    message: str  # the engine's own error, verbatim where it has one
    fix: str
    source: str  # where the behaviour is defined
    check: Callable[[Argv], str | None]


@dataclass(frozen=True)
class Finding:
    config: str
    rule: Rule
    found: str

    @property
    def severity(self) -> Severity:
        return self.rule.severity

    def __str__(self) -> str:
        verb = "would stop with" if self.severity == "error" else "warning"
        return (
            f"{self.config}: {self.found}: {_ENGINE_NAMES[self.rule.engine]} {verb}: {self.rule.message}\n  "
            f"fix: {self.rule.fix}\n  (rule {self.rule.id}; {self.rule.source})"
        )


_ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "llamacpp": "llama-server", "generic": "the server"}

# ---- SGLang ------------------------------------------------------------------------------------------------

_SGL_ALGO = ("--speculative-algorithm",)
_SGL_TOPK = ("--speculative-eagle-topk",)
_SGL_STEPS = ("--speculative-num-steps",)
_SGL_DRAFT_TOKENS = ("--speculative-num-draft-tokens",)
_SGL_BACKENDS = ("--attention-backend", "--decode-attention-backend", "--prefill-attention-backend")
_SGL_PAGE = ("--page-size",)
_SGL_MAMBA_STRATEGY = ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy")
_SGL_MODEL = ("--model-path", "--model")
_SGL_SOURCE = "sgl-project/sglang python/sglang/srt/server_args.py"
_SGL_KNOWN = (
    *_SGL_ALGO,
    *_SGL_TOPK,
    *_SGL_STEPS,
    *_SGL_DRAFT_TOKENS,
    *_SGL_BACKENDS,
    *_SGL_PAGE,
    *_SGL_MAMBA_STRATEGY,
    *_SGL_MODEL,
    "--speculative-adaptive",
    "--speculative-draft-model-path",
    "--disable-radix-cache",
    "--enable-dp-attention",
)
_HYBRID_MODELS = re.compile(r"qwen3[._-]?5|qwen3[._-]?next", re.I)


def _sgl_algo(a: Argv) -> str | None:
    algo = a.value(*_SGL_ALGO)
    return algo.upper() if algo and algo.lower() != "none" else None


# The draft-tree checks (topk, num_steps, the tree's attention backend) run in SGLang's EAGLE branch only;
# NEXTN is renamed EAGLE before it. NGRAM has its own branch where num_draft_tokens alone is normal.
_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


def _eagle_family(a: Argv) -> bool:
    return _sgl_algo(a) in _EAGLE_FAMILY


def _spec_v2_topk(a: Argv) -> str | None:
    topk = a.int_value(*_SGL_TOPK)
    if _eagle_family(a) and a.env_on("SGLANG_ENABLE_SPEC_V2") and topk is not None and topk > 1:
        return f"--speculative-eagle-topk {topk} with SGLANG_ENABLE_SPEC_V2={a.env['SGLANG_ENABLE_SPEC_V2']}"
    return None


def _topk_without_steps(a: Argv) -> str | None:
    if not _eagle_family(a) or a.has(*_SGL_STEPS) or a.has("--speculative-adaptive"):
        return None
    given = [f"{hit[0]} {hit[1]}" for names in (_SGL_TOPK, _SGL_DRAFT_TOKENS) if (hit := a.find(*names))]
    return f"{' and '.join(given)} without --speculative-num-steps" if given else None


def _trtllm_topk(a: Argv) -> str | None:
    topk = a.int_value(*_SGL_TOPK)
    if not _eagle_family(a) or topk is None or topk <= 1:
        return None
    for name in _SGL_BACKENDS:
        if a.value(name) == "trtllm_mha":
            return f"{name} trtllm_mha with --speculative-eagle-topk {topk}"
    return None


def _page_tree(a: Argv, *, newer_backends: bool) -> str | None:
    """topk > 1 with page_size > 1: every release accepts it on flashinfer, newer ones also on fa3/triton
    (and the default backend may be one of those): those are a warning, any other backend an error."""
    topk, page = a.int_value(*_SGL_TOPK), a.int_value(*_SGL_PAGE)
    if not _eagle_family(a) or topk is None or topk <= 1 or page is None or page <= 1:
        return None
    backend = a.value("--attention-backend")
    if backend == "flashinfer" or newer_backends != (backend in (None, "fa3", "triton")):
        return None
    shown = f"--attention-backend {backend}" if backend else "the default attention backend"
    return f"--speculative-eagle-topk {topk} with --page-size {page} on {shown}"


def _hybrid_without_extra_buffer(a: Argv) -> str | None:
    algo = _sgl_algo(a)
    if not algo:
        return None
    model = a.value(*_SGL_MODEL) or ""
    mamba_flag = next((t.split("=", 1)[0] for t in a.tokens if t.startswith("--mamba")), None)
    if not (_HYBRID_MODELS.search(model) or mamba_flag):
        return None
    strategy = a.value(*_SGL_MAMBA_STRATEGY) or "no_buffer"
    if strategy == "extra_buffer" or a.has("--disable-radix-cache"):
        return None
    what = f"model {model}" if _HYBRID_MODELS.search(model) else f"hybrid model ({mamba_flag})"
    return f"--speculative-algorithm {algo} on {what} with mamba scheduler strategy {strategy}"


def _dp_attention(algorithm: str) -> Callable[[Argv], str | None]:
    def check(a: Argv) -> str | None:
        if _sgl_algo(a) == algorithm and a.has("--enable-dp-attention"):
            return f"--speculative-algorithm {algorithm} with --enable-dp-attention"
        return None

    return check


# ---- llama.cpp ---------------------------------------------------------------------------------------------

_LCPP_DRAFT = ("-md", "--model-draft", "--spec-draft-model")


# llama-server reads every flag from an environment variable too (common/arg.cpp set_env); a flag wins.
_LCPP_DRAFT_ENV = ("LLAMA_ARG_SPEC_DRAFT_MODEL", "LLAMA_ARG_MODEL_DRAFT")
_LCPP_SPEC_TYPE_ENV = "LLAMA_ARG_SPEC_TYPE"


def _draft_without_spec_type(a: Argv) -> str | None:
    hit = a.find(*_LCPP_DRAFT)
    draft = (
        hit[0]
        if hit is not None
        else next((f"{k}={a.env[k]}" for k in _LCPP_DRAFT_ENV if a.env.get(k)), None)
    )
    if draft is None:
        return None
    spec_type = a.value("--spec-type")
    if spec_type is None:
        spec_type = a.env.get(_LCPP_SPEC_TYPE_ENV)
    if spec_type is None or spec_type.strip().lower() == "none":
        return f"{draft} without --spec-type" if spec_type is None else f"{draft} with --spec-type none"
    return None


# ---- vLLM --------------------------------------------------------------------------------------------------

_VLLM_CONFIG = ("--speculative-config", "-sc")
# methods that need no separate draft weights (vllm/config/speculative.py fills `model` for these itself)
_VLLM_MODELLESS = re.compile(r"^(ngram|\[ngram\]|ngram_gpu|suffix|extract_hidden_states|mtp|\w+_mtp)$")


def _vllm_spec(a: Argv) -> dict[str, Any] | str | None:
    """The speculative config as vLLM would see it (JSON plus the newer --spec-* flags); a str on bad JSON."""
    raw = a.value(*_VLLM_CONFIG)
    spec: dict[str, Any] = {}
    if raw is not None:
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as e:
            return f"--speculative-config {raw!r} is not valid JSON ({e.msg} at column {e.colno})"
        if not isinstance(parsed, dict):
            return f"--speculative-config {raw!r} is JSON but not an object"
        spec.update(parsed)
    for flag, key in (
        ("--spec-method", "method"),
        ("--spec-model", "model"),
        ("--spec-tokens", "num_speculative_tokens"),
    ):
        if (v := a.value(flag)) is not None:
            spec[key] = v
    return spec or None


def _vllm_bad_json(a: Argv) -> str | None:
    spec = _vllm_spec(a)
    return spec if isinstance(spec, str) else None


def _vllm_tokens_without_model(a: Argv) -> str | None:
    spec = _vllm_spec(a)
    if not isinstance(spec, dict) or spec.get("num_speculative_tokens") is None or spec.get("model"):
        return None
    method = spec.get("method")
    if method is not None and _VLLM_MODELLESS.match(str(method)):
        return None
    return f"num_speculative_tokens={spec['num_speculative_tokens']} with method={method} and no model"


def _vllm_lookup_order(a: Argv) -> str | None:
    spec = _vllm_spec(a)
    if not isinstance(spec, dict):
        return None
    lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    try:
        if lo is not None and hi is not None and int(lo) > int(hi):
            return f"prompt_lookup_min={lo} > prompt_lookup_max={hi} in --speculative-config"
    except (TypeError, ValueError):
        return None
    return None


# ---- the rules ---------------------------------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    Rule(
        id="sglang-spec-v2-topk",
        engine="sglang",
        flag="--speculative-eagle-topk",
        severity="error",
        message="ValueError: Spec v2 currently only supports topk = 1 for speculative decoding.",
        fix="use --speculative-eagle-topk 1 with SGLANG_ENABLE_SPEC_V2=1, or drop SGLANG_ENABLE_SPEC_V2 to "
        "run topk > 1 on spec v1 (newer releases fall back to v1 silently and disable the overlap "
        "scheduler, which changes what the comparison measures)",
        source=f"{_SGL_SOURCE} (_handle_speculative_decoding)",
        check=_spec_v2_topk,
    ),
    Rule(
        id="sglang-topk-without-steps",
        engine="sglang",
        flag="--speculative-num-steps",
        severity="error",
        message="AssertionError (bare, no message) from `assert (self.speculative_eagle_topk is None and "
        "self.speculative_num_draft_tokens is None)`",
        fix="give all three of --speculative-num-steps, --speculative-eagle-topk and "
        "--speculative-num-draft-tokens, or none of them to let SGLang choose (e.g. add "
        "--speculative-num-steps 3)",
        source=f"{_SGL_SOURCE} (auto-choose of speculative params)",
        check=_topk_without_steps,
    ),
    Rule(
        id="sglang-trtllm-mha-topk",
        engine="sglang",
        flag="--attention-backend",
        severity="error",
        message="ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding.",
        fix="use --speculative-eagle-topk 1, or another --attention-backend (e.g. flashinfer)",
        source=_SGL_SOURCE,
        check=_trtllm_topk,
    ),
    Rule(
        id="sglang-topk-page-size",
        engine="sglang",
        flag="--page-size",
        severity="error",
        message="ValueError: speculative_eagle_topk > 1 with page_size > 1 is unstable and produces "
        "incorrect results for paged attention backends. This combination is only supported for the "
        "'flashinfer' backend.",
        fix="use --attention-backend flashinfer, or --page-size 1, or --speculative-eagle-topk 1",
        source=_SGL_SOURCE,
        check=lambda a: _page_tree(a, newer_backends=False),
    ),
    Rule(
        id="sglang-topk-page-size-backend",
        engine="sglang",
        flag="--page-size",
        severity="warning",
        message="releases before the two-pass tree draft accept speculative_eagle_topk > 1 with page_size > "
        "1 only on 'flashinfer' (newer ones also on fa3 and triton) and stop with a ValueError otherwise",
        fix="pin --attention-backend flashinfer, or check your SGLang version accepts this backend",
        source=_SGL_SOURCE,
        check=lambda a: _page_tree(a, newer_backends=True),
    ),
    Rule(
        id="sglang-hybrid-extra-buffer",
        engine="sglang",
        flag="--mamba-scheduler-strategy",
        severity="error",
        message="ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible "
        "with radix cache when using --mamba-scheduler-strategy no_buffer. To use radix cache with "
        "speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set "
        "SGLANG_ENABLE_SPEC_V2=1.",
        fix="add --mamba-scheduler-strategy extra_buffer and env SGLANG_ENABLE_SPEC_V2=1 (or "
        "--disable-radix-cache)",
        source=f"{_SGL_SOURCE} (_handle_mamba_radix_cache)",
        check=_hybrid_without_extra_buffer,
    ),
    Rule(
        id="sglang-standalone-dp-attention",
        engine="sglang",
        flag="--enable-dp-attention",
        severity="error",
        message="Currently standalone speculative decoding does not support dp attention.",
        fix="drop --enable-dp-attention, or use --speculative-algorithm EAGLE",
        source=_SGL_SOURCE,
        check=_dp_attention("STANDALONE"),
    ),
    Rule(
        id="sglang-ngram-dp-attention",
        engine="sglang",
        flag="--enable-dp-attention",
        severity="error",
        message="Currently ngram speculative decoding does not support dp attention.",
        fix="drop --enable-dp-attention, or use --speculative-algorithm EAGLE",
        source=_SGL_SOURCE,
        check=_dp_attention("NGRAM"),
    ),
    Rule(
        # A warning, not an error: the server starts and serves, and recent builds may pick a type from the
        # draft GGUF. But where the type defaults to none it loads the draft and never speculates, so the
        # "speculative" run silently measures the baseline again.
        id="llamacpp-draft-without-spec-type",
        engine="llamacpp",
        flag="--spec-type",
        severity="warning",
        message="nothing: the draft model loads but --spec-type defaults to none, so it never speculates "
        "(ggml-org/llama.cpp issue #25345)",
        fix="add --spec-type draft-simple (or the draft type you mean, e.g. draft-eagle3)",
        source="ggml-org/llama.cpp common/arg.cpp (--spec-type, -md/--spec-draft-model)",
        check=_draft_without_spec_type,
    ),
    Rule(
        id="vllm-speculative-config-json",
        engine="vllm",
        flag="--speculative-config",
        severity="error",
        message="vllm serve: error: argument --speculative-config: Value ... cannot be converted to "
        "<function loads ...>.",
        fix='give one JSON object as the argument, e.g. {"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4} (in a plan, quote it in YAML; on a shell line, in single quotes)',
        source="vllm-project/vllm vllm/engine/arg_utils.py",
        check=_vllm_bad_json,
    ),
    Rule(
        id="vllm-spec-tokens-without-model",
        engine="vllm",
        flag="--speculative-config",
        severity="error",
        message="ValueError: num_speculative_tokens was provided but without speculative model.",
        fix='add "model": "<draft model or EAGLE head>" to --speculative-config, or a method that needs none '
        '("method": "ngram", "suffix" or "mtp")',
        source="vllm-project/vllm vllm/config/speculative.py (SpeculativeConfig.__post_init__)",
        check=_vllm_tokens_without_model,
    ),
    Rule(
        id="vllm-prompt-lookup-order",
        engine="vllm",
        flag="--speculative-config",
        severity="error",
        message="ValueError: prompt_lookup_min=... must be <= prompt_lookup_max=...",
        fix="make prompt_lookup_min <= prompt_lookup_max in --speculative-config",
        source="vllm-project/vllm vllm/config/speculative.py",
        check=_vllm_lookup_order,
    ),
)

_KNOWN: dict[str, tuple[str, ...]] = {
    "sglang": _SGL_KNOWN,
    "vllm": (*_VLLM_CONFIG, "--spec-method", "--spec-model", "--spec-tokens"),
}


def command_tokens(spec: ServerSpec) -> tuple[str, ...]:
    """The command's arguments as the engine receives them (a shell line is split the way /bin/sh would)."""
    if spec.shell:
        try:
            return tuple(shlex.split(" ".join(spec.argv)))
        except ValueError:
            return spec.argv
    return spec.argv


def preflight(
    spec: ServerSpec, environ: Mapping[str, str] | None = None, rules: Sequence[Rule] = RULES
) -> list[Finding]:
    """Every rule of the spec's engine that its command line breaks. `environ` is what the server inherits
    (default: this process's environment); the plan's env is laid over it."""
    env = {**(os.environ if environ is None else environ), **spec.env}
    argv = Argv(command_tokens(spec), env, _KNOWN.get(spec.engine, ()))
    findings = []
    for rule in rules:
        if rule.engine == spec.engine and (found := rule.check(argv)) is not None:
            findings.append(Finding(spec.name, rule, found))
    return findings


def preflight_plan(plan: Plan, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Check every configuration; raise PreflightError listing every error; return the warnings."""
    findings = [f for spec in plan.configs for f in preflight(spec, environ)]
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        n = len(errors)
        raise PreflightError(
            f"{n} configuration problem{'s' if n > 1 else ''} that would crash at launch "
            f"(nothing was started):\n" + "\n".join(str(f) for f in errors)
        )
    return [f for f in findings if f.severity == "warning"]
