"""Per-engine facts (health, metrics and configuration endpoints), the resolved-configuration capture, the
environment, and the diff of two resolved configurations that flags what the plan did not ask to change.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokbench import __version__


@dataclass(frozen=True)
class EngineFacts:
    """What tokbench knows about one engine's HTTP surface."""

    name: str
    health_paths: tuple[str, ...]  # ready when any answers 200
    metrics_path: str | None
    config_paths: tuple[str, ...]  # resolved configuration, read once the server is ready


ENGINES: dict[str, EngineFacts] = {
    # /health_generate runs one generation, so it proves the model works; /health is for older builds
    "sglang": EngineFacts(
        "sglang", ("/health_generate", "/health"), "/metrics", ("/get_server_info", "/server_info")
    ),
    # the API server answers /health before the model is listed; /v1/models is the model-ready probe
    "vllm": EngineFacts("vllm", ("/v1/models",), "/metrics", ("/v1/models", "/version")),
    # 503 {"error": {"message": "Loading model"}} while loading, then 200 {"status": "ok"}
    "llamacpp": EngineFacts("llamacpp", ("/health",), "/metrics", ("/props", "/slots")),
    "generic": EngineFacts("generic", ("/v1/models",), "/metrics", ("/v1/models",)),
}

# A direct opener: an http_proxy in the environment must not intercept requests to a server on 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int | None, bytes]:
    """(status, body) of a GET; status None when nothing answered (refused, reset, timed out)."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() if e.fp is not None else b""
    except (OSError, ValueError):  # URLError, connection refused/reset, socket timeout, bad URL
        return None, b""


def get_json(url: str, timeout_s: float = 5.0) -> Any | None:
    status, body = http_get(url, timeout_s)
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


# ---- resolved configuration -------------------------------------------------------------------------------

_VLLM_ARGS = re.compile(r"non-default args: (\{.*\})\s*$")
_VLLM_VERSION = re.compile(r"vLLM API server version ([\w.+-]+)")


def logged_vllm_args(log_text: str) -> dict[str, Any]:
    """The `non-default args: {...}` vLLM logs at start (a Python dict literal), or {} if absent."""
    for line in reversed(log_text.splitlines()):
        m = _VLLM_ARGS.search(line)
        if m:
            try:
                value = ast.literal_eval(m.group(1))
            except (ValueError, SyntaxError):
                return {"unparsed": m.group(1)}
            return dict(value) if isinstance(value, dict) else {}
    return {}


def _slots_summary(slots: Any) -> dict[str, Any] | None:
    # Per-slot state (task ids, prompts, decoded counts) changes from request to request; keep what is config.
    if not isinstance(slots, list) or not slots or not isinstance(slots[0], dict):
        return None
    first = slots[0]
    keep = {k: first[k] for k in ("n_ctx", "speculative") if k in first}
    params = first.get("params")
    if isinstance(params, dict):
        keep["speculative_params"] = {k: v for k, v in params.items() if str(k).startswith("speculative")}
    return {"count": len(slots), **keep}


def capture_resolved(
    base_url: str, engine: str, log_text: str = "", timeout_s: float = 5.0
) -> dict[str, Any]:
    """The configuration the running engine actually uses, read from its own endpoints (and, for vLLM, the
    arguments it logged). Endpoints that do not answer are left out; never raises for a missing endpoint."""
    facts = ENGINES.get(engine, ENGINES["generic"])
    base = base_url.rstrip("/")
    out: dict[str, Any] = {}
    if engine == "sglang":
        for path in facts.config_paths:  # /get_server_info was renamed /server_info
            info = get_json(base + path, timeout_s)
            if isinstance(info, dict):
                out["server_info"] = info
                break
    elif engine == "llamacpp":
        props = get_json(base + "/props", timeout_s)
        if props is not None:
            out["props"] = props
        slots = _slots_summary(get_json(base + "/slots", timeout_s))
        if slots is not None:
            out["slots"] = slots
    else:
        models = get_json(base + "/v1/models", timeout_s)
        if models is not None:
            out["models"] = models
        if engine == "vllm":
            version = get_json(base + "/version", timeout_s)
            if version is not None:
                out["version"] = version
            args = logged_vllm_args(log_text)
            if args:
                out["logged_args"] = args
    return out


def engine_version(engine: str, resolved: Mapping[str, Any], log_text: str = "") -> str | None:
    """The engine's version as it reports it, if it does."""
    if engine == "sglang":
        v = resolved.get("server_info", {}).get("version")
    elif engine == "vllm":
        v = (resolved.get("version") or {}).get("version")
        if v is None and (m := _VLLM_VERSION.search(log_text)):
            v = m.group(1)
    elif engine == "llamacpp":
        v = resolved.get("props", {}).get("build_info")
    else:
        v = None
    return str(v) if v is not None else None


# ---- environment -------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names(timeout_s: float = 10.0) -> list[str]:
    """GPU names and drivers from nvidia-smi, [] when it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def environment() -> dict[str, Any]:
    """Where the measurement ran: tokbench and Python versions, host, CPU, GPUs."""
    return {
        "tokbench_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": gpu_names(),
    }


# ---- configuration diff ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigDifference:
    """One resolved setting that differs between A and B; `expected` when a changed flag explains it."""

    key: str
    a: Any
    b: Any
    expected: bool

    def __str__(self) -> str:
        return f"{self.key}: {_show(self.a)} → {_show(self.b)}"


def _show(v: Any) -> str:
    if v is _MISSING:
        return "(absent)"
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 60 else text[:57] + "..."


class _Missing:
    def __repr__(self) -> str:
        return "(absent)"


_MISSING: Any = _Missing()

# Settings that differ between any two launches without meaning anything: ports, ids, clocks, live counters.
VOLATILE = re.compile(
    r"(^|\.)(port|nccl_port|metrics_http_port|host|dist_init_addr|pid|random_seed|seed|created|uptime\w*|\w*_time"
    r"|\w*timestamp\w*|id_task|is_processing|n_decoded|next_token|prompt|internal_states|permission"
    r"|last_gen_throughput|\w*throughput\w*|memory_usage|file_storage_path|media_marker|is_sleeping)(\.|\[|$)"
)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'l': [{'x': 1}]} -> {'a.b': 1, 'l[0].x': 1}; lists of scalars stay whole values."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list | tuple) and any(isinstance(x, Mapping | list | tuple) for x in value):
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = list(value) if isinstance(value, tuple) else value
    return out


def _flag_key(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").lower()


# llama.cpp's short flags and the settings /props and /slots report for them.
_SHORT_FLAG_SETTINGS: dict[str, tuple[str, ...]] = {
    "c": ("ctx_size", "n_ctx"),
    "np": ("parallel", "n_parallel", "total_slots"),
    "b": ("batch_size", "n_batch"),
    "ub": ("ubatch_size", "n_ubatch"),
    "t": ("threads", "n_threads"),
    "ngl": ("n_gpu_layers", "gpu_layers"),
    "md": ("model_draft", "draft_model", "model_path_draft"),
    "m": ("model", "model_path"),
}


def _explained(key: str, flags: Sequence[str]) -> bool:
    """A changed flag explains a setting named like it: the same name, a name containing it, or one of its
    family (`--speculative-num-steps` explains `speculative_eagle_topk`). Short flags (`-c`, `-np`) only
    explain a setting of exactly their name: as substrings they would explain almost anything."""
    parts = [p for p in re.split(r"[.\[\]]", key.lower()) if p and not p.isdigit()]
    for flag in flags:
        name = _flag_key(flag)
        if any(part in _SHORT_FLAG_SETTINGS.get(name, ()) for part in parts):
            return True
        family = name.split("_", 1)[0]
        for part in parts:
            if (
                part == name
                or (len(name) >= 4 and name in part)
                or (len(family) >= 4 and part.startswith(family))
            ):
                return True
    return False


def config_diff(
    a: Mapping[str, Any], b: Mapping[str, Any], changed_flags: Iterable[str]
) -> list[ConfigDifference]:
    """Every flattened resolved setting that differs between A and B (volatile ones skipped), each marked
    whether a flag the plan changed explains it. An unexplained difference is what sglang #39515 was: a
    speculative flag that silently switched attention_backend trtllm_mha -> triton and page_size 64 -> 1."""
    flags = list(changed_flags)
    fa, fb = flatten(a), flatten(b)
    diffs = []
    for key in sorted(fa.keys() | fb.keys()):
        if VOLATILE.search(key):
            continue
        va, vb = fa.get(key, _MISSING), fb.get(key, _MISSING)
        if va != vb:
            diffs.append(ConfigDifference(key, va, vb, _explained(key, flags)))
    return diffs


def changed_flags(
    a_argv: Sequence[str],
    b_argv: Sequence[str],
    a_env: Mapping[str, str] | None = None,
    b_env: Mapping[str, str] | None = None,
) -> list[str]:
    """The flags (and environment variables) whose values differ between two command lines."""
    pa, pb = _flag_values(a_argv), _flag_values(b_argv)
    out = [f for f in sorted(pa.keys() | pb.keys()) if pa.get(f) != pb.get(f) and f != "--port"]
    ea, eb = a_env or {}, b_env or {}
    out += [k for k in sorted(ea.keys() | eb.keys()) if ea.get(k) != eb.get(k)]
    return out


def _flag_values(argv: Sequence[str]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for i, tok in enumerate(argv):
        if not tok.startswith("-") or re.match(r"^-\d", tok):
            continue
        if "=" in tok:
            flag, value = tok.split("=", 1)
            values[flag] = value
        else:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            values[tok] = nxt if nxt is not None and not nxt.startswith("-") else None
    return values


def json_safe(value: Any) -> Any:
    """A _MISSING-free, JSON-writable copy of a diff value."""
    return None if value is _MISSING else value
