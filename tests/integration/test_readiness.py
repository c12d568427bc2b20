"""Readiness against real HTTP servers in real processes over real sockets: the wait a campaign does
(`ServerProcess.start()` then `wait_ready()`) must honour each engine's probe. llama.cpp's 503 "Loading model"
is not ready; SGLang falls back from /health_generate to /health only on a 404; vLLM is ready when
/v1/models answers, not /health; a plan's `ready_url` replaces the engine's probe; a log marker that never
appears ends in a deadline error naming the configuration and the marker. Every test checks that the server
process is gone afterwards.

The server is a small stdlib script whose answers change with its own age (seconds since it started), and
which logs every request it answered with the status, so a test can tell which URLs were polled and how often.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from campaign_procs import assert_none_left, processes_with

from tokbench.config import ServerSpec
from tokbench.errors import ServerStartError
from tokbench.server.engines import http_get
from tokbench.server.launch import ServerProcess, group_members

# argv: PORT CONFIG_JSON TOKEN. CONFIG_JSON: {"listen_after_s": s, "print": [lines], "routes": {path:
# [[until_s or null, status, body], ...]}}; a path answers with the first entry whose until_s is null or above
# the age.
# Paths not in routes answer 404. Each answered request is logged (before the answer is sent) as
# `REQ <age> GET <path> <status>`.
SERVER = textwrap.dedent(
    """
    import time
    T0 = time.monotonic()
    import http.server, json, sys
    port, cfg = int(sys.argv[1]), json.loads(sys.argv[2])
    for line in cfg.get("print", []):
        print(line, flush=True)
    time.sleep(cfg.get("listen_after_s", 0.0))

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            age = time.monotonic() - T0
            path = self.path.split("?", 1)[0]
            status, body = 404, {"detail": "Not Found"}
            for until, st, b in cfg["routes"].get(path, []):
                if until is None or age < until:
                    status, body = st, b
                    break
            print(f"REQ {age:.3f} GET {path} {status}", flush=True)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    print("listening", flush=True)
    srv.serve_forever()
    """
)

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
OK = {"status": "ok"}
MODELS = {"object": "list", "data": [{"id": "tiny"}]}
_REQ = re.compile(r"^REQ (\d+\.\d+) GET (\S+) (\d+)$")


@pytest.fixture
def token() -> Iterator[str]:
    t = f"tokbench-ready-{uuid.uuid4().hex[:12]}"
    yield t
    assert_none_left(t)


def spec(token: str, cfg: dict[str, Any], **kw: Any) -> ServerSpec:
    argv = [sys.executable, "-c", SERVER, "{port}", json.dumps(cfg), token]
    return ServerSpec(**{"name": "tiny", "argv": argv, **kw})


def requests(proc: ServerProcess) -> list[tuple[float, str, int]]:
    """(server age, path, status) of every request the server answered, in order."""
    out = []
    for line in proc.log_text().splitlines():
        m = _REQ.match(line)
        if m:
            out.append((float(m.group(1)), m.group(2), int(m.group(3))))
    return out


def wait(proc: ServerProcess, token: str) -> tuple[float, list[float]]:
    """start() and wait_ready() as a campaign launch does; (ready after, on_wait elapsed times)."""
    waits: list[float] = []
    proc.start()
    ready = proc.wait_ready(on_wait=lambda elapsed, line: waits.append(elapsed))
    assert processes_with(token) == [proc.pid]  # the launched server itself is what answered
    return ready, waits


def stop(proc: ServerProcess) -> None:
    pgid = proc.pid
    proc.stop(grace_s=2.0)
    assert pgid is not None and group_members(pgid) == []


def test_llamacpp_loading_model_503_is_not_ready(tmp_path: Path, token: str) -> None:
    loading_s = 1.0
    # /v1/models answers from the start: llama.cpp's probe must not be fooled by it
    cfg = {
        "routes": {
            "/health": [[loading_s, 503, LOADING], [None, 200, OK]],
            "/v1/models": [[None, 200, MODELS]],
        }
    }
    p = ServerProcess(spec(token, cfg, engine="llamacpp", ready_timeout_s=8), tmp_path / "llama.log")
    try:
        ready, waits = wait(p, token)
        seen = requests(p)
    finally:
        stop(p)
    # the server's age is measured from inside the child, so it is behind the launcher's clock
    assert ready >= loading_s
    assert p.ready_after_s == ready
    assert {path for _, path, _ in seen} == {"/health"}
    statuses = [status for _, _, status in seen]
    # polled through the loading period (several 503s, each followed by another try), ready on the first 200
    assert statuses.count(503) >= 2 and statuses[-1] == 200 and statuses.count(200) == 1
    assert statuses == [503] * (len(statuses) - 1) + [200]
    assert seen[-1][0] >= loading_s
    assert len(waits) >= statuses.count(503)


def test_sglang_falls_back_to_health_when_health_generate_is_404(tmp_path: Path, token: str) -> None:
    # an older build: no /health_generate route at all (404), /health answers 200
    cfg = {"routes": {"/health": [[None, 200, OK]]}}
    p = ServerProcess(spec(token, cfg, engine="sglang", ready_timeout_s=6), tmp_path / "sglang.log")
    try:
        ready, _ = wait(p, token)
        seen = requests(p)
    finally:
        stop(p)
    assert ready < 6
    # the last probe asked /health_generate, got 404, then asked /health in the same round
    assert [(path, status) for _, path, status in seen[-2:]] == [("/health_generate", 404), ("/health", 200)]
    assert all(path in ("/health_generate", "/health") for _, path, _ in seen)


def test_sglang_does_not_fall_back_while_health_generate_is_503(tmp_path: Path, token: str) -> None:
    # /health_generate exists but cannot generate yet; /health already answers 200: that must not count
    busy_s = 1.0
    cfg = {
        "routes": {
            "/health_generate": [[busy_s, 503, {"error": "not ready"}], [None, 200, OK]],
            "/health": [[None, 200, OK]],
        }
    }
    p = ServerProcess(spec(token, cfg, engine="sglang", ready_timeout_s=8), tmp_path / "sglang.log")
    try:
        ready, _ = wait(p, token)
        seen = requests(p)
    finally:
        stop(p)
    assert ready >= busy_s
    busy = [(path, status) for _, path, status in seen if status == 503]
    assert len(busy) >= 2 and set(busy) == {("/health_generate", 503)}
    assert all(path == "/health_generate" for _, path, _ in seen)  # a 503 never falls through to /health
    assert seen[-1][1:] == ("/health_generate", 200)


def test_vllm_is_ready_when_v1_models_answers(tmp_path: Path, token: str) -> None:
    # nothing listens for a while (connection refused), then /health answers at once but /v1/models only later
    listen_s, models_s = 0.4, 1.2
    cfg = {
        "listen_after_s": listen_s,
        "routes": {"/health": [[None, 200, {}]], "/v1/models": [[models_s, 503, {}], [None, 200, MODELS]]},
    }
    p = ServerProcess(spec(token, cfg, engine="vllm", ready_timeout_s=8), tmp_path / "vllm.log")
    try:
        ready, waits = wait(p, token)
        seen = requests(p)
        status, body = http_get(p.base_url + "/v1/models")
        assert status == 200 and json.loads(body) == MODELS
    finally:
        stop(p)
    assert ready >= models_s
    assert {path for _, path, _ in seen} == {"/v1/models"}
    assert [status for _, _, status in seen][-1] == 200
    assert [status for _, _, status in seen].count(503) >= 1
    assert all(age >= listen_s for age, _, _ in seen)
    # some rounds found nothing listening: more waits than answered 503s
    assert len(waits) > [status for _, _, status in seen].count(503)


@pytest.mark.parametrize("ready_url", ["/ready", "http://{host}:{port}/ready"])
def test_generic_polls_the_plan_ready_url(tmp_path: Path, token: str, ready_url: str) -> None:
    # /v1/models (the generic default) answers 200 from the start; only /ready says when the server is ready
    ready_s = 1.0
    cfg = {"routes": {"/v1/models": [[None, 200, MODELS]], "/ready": [[ready_s, 503, {}], [None, 200, OK]]}}
    p = ServerProcess(
        spec(token, cfg, engine="generic", ready_url=ready_url, ready_timeout_s=8), tmp_path / "gen.log"
    )
    try:
        ready, _ = wait(p, token)
        seen = requests(p)
        assert p.probe_urls() == [f"http://127.0.0.1:{p.port}/ready"]
    finally:
        stop(p)
    assert ready >= ready_s
    assert {path for _, path, _ in seen} == {"/ready"}  # /v1/models was never asked
    statuses = [status for _, _, status in seen]
    assert statuses.count(503) >= 2 and statuses[-1] == 200


def test_marker_never_printed_hits_the_deadline(tmp_path: Path, token: str) -> None:
    # the probe is fine from the start; the marker never appears (a similar line does)
    deadline_s = 1.5
    marker = "The server is fired up and ready to roll!"
    cfg = {"print": ["The server is fired up"], "routes": {"/health_generate": [[None, 200, OK]]}}
    p = ServerProcess(
        spec(token, cfg, name="nextn", engine="sglang", ready_marker=marker, ready_timeout_s=deadline_s),
        tmp_path / "nextn-1.log",
    )
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerStartError) as e:
            wait(p, token)
        took = time.monotonic() - t0
        seen = requests(p)
        assert not p.alive()  # stopped by the deadline, not by us
    finally:
        stop(p)
    assert took >= deadline_s
    msg = str(e.value)
    first = msg.splitlines()[0]
    assert first.startswith("nextn: not ready after ")
    assert f"still waiting for the log line {marker!r}" in first
    assert "its probe" not in first  # the probe answered; only the marker was missing
    assert str(tmp_path / "nextn-1.log") in msg
    assert p.ready_after_s is None
    # the probe answered 200 again and again, and that alone was not enough
    assert [status for _, _, status in seen].count(200) >= 2
