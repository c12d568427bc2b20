"""Launching real processes: readiness (probe + log marker), the free-port check, crash triage, deadlines,
and teardown of the whole process group after success, crash, SIGTERM, Ctrl-C and interpreter exit."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from campaign_procs import assert_none_left, processes_with

from tokbench.config import ServerSpec
from tokbench.errors import ServerStartError
from tokbench.server.engines import capture_resolved
from tokbench.server.launch import ServerProcess, group_members

# A tiny HTTP server: `loading weights`, a pause, `server ready`, then /health answers 200.
# argv: PORT DELAY TOKEN [child]; with `child` it first starts a grandchild that ignores SIGTERM (only the
# group SIGKILL can end it).
SERVER = textwrap.dedent(
    """
    import http.server, signal, subprocess, sys, time
    port, delay, token = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    if len(sys.argv) > 4:
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
        subprocess.Popen([sys.executable, "-c", code, token])
    print("loading weights", flush=True)
    time.sleep(delay)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
            self.end_headers()
            self.wfile.write(b'{"data": [{"id": "tiny"}]}')
        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    print("server ready", flush=True)
    srv.serve_forever()
    """
)


@pytest.fixture
def token() -> Iterator[str]:
    t = f"tokbench-test-{uuid.uuid4().hex[:12]}"
    yield t
    assert_none_left(t)


def tiny(token: str, delay: float = 0.2, child: bool = False, **kw: object) -> ServerSpec:
    argv = [sys.executable, "-c", SERVER, "{port}", str(delay), token, *(["child"] if child else [])]
    return ServerSpec(name="tiny", engine="llamacpp", argv=argv, **kw)  # type: ignore[arg-type]


def test_ready_needs_probe_and_marker_then_stop_leaves_nothing(tmp_path: Path, token: str) -> None:
    seen: list[tuple[float, str]] = []
    p = ServerProcess(
        tiny(token, delay=0.5, ready_marker="server ready", ready_timeout_s=20), tmp_path / "t.log"
    )
    p.start()
    try:
        elapsed = p.wait_ready(on_wait=lambda e, line: seen.append((e, line)))
        assert p.alive() and elapsed > 0
        assert any(line == "loading weights" for _, line in seen)  # progress showed the last log line
        assert [e for e, _ in seen] == sorted(e for e, _ in seen)
        assert "server ready" in p.log_text()
        assert p.base_url == f"http://127.0.0.1:{p.port}"
        assert capture_resolved(p.base_url, "generic")["models"]["data"][0]["id"] == "tiny"
        assert processes_with(token) == [p.pid]
    finally:
        pgid = p.pid
        p.stop()
    assert pgid is not None and group_members(pgid) == []
    assert p.exit_code == -signal.SIGTERM


def test_missing_marker_hits_the_deadline_and_is_stopped(tmp_path: Path, token: str) -> None:
    p = ServerProcess(tiny(token, ready_marker="never printed", ready_timeout_s=1.5), tmp_path / "t.log")
    p.start()
    with pytest.raises(ServerStartError) as e:
        p.wait_ready()
    msg = str(e.value)
    assert msg.startswith("tiny: not ready after 2 s") and "the log line 'never printed'" in msg
    assert "| server ready" in msg  # the tail is in the message
    assert not p.alive()


def test_port_in_use_fails_before_launch(tmp_path: Path, token: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = ServerProcess(tiny(token, port=port), tmp_path / "t.log")
        with pytest.raises(
            ServerStartError, match=rf"port {port} is already in use \(address already in use\)"
        ):
            p.start()
    assert p.pid is None and processes_with(token) == []


def test_python_assertion_is_the_root_cause(tmp_path: Path, token: str) -> None:
    script = tmp_path / "server_args.py"
    script.write_text(
        "import sys\n"
        "def handle(topk, draft):\n"
        "    assert (\n"
        "        topk is None\n"
        "        and draft is None\n"
        "    )\n"
        "print('server_args=ServerArgs(...)', flush=True)\n"
        "handle(1, 2)\n"
    )
    spec = ServerSpec(name="nextn", argv=[sys.executable, str(script), "{port}", token])
    p = ServerProcess(spec, tmp_path / "nextn-1.log")
    p.start()
    with pytest.raises(ServerStartError) as e:
        p.wait_ready(deadline_s=20)
    p.stop()
    msg = str(e.value)
    assert msg.startswith("nextn: exited before it was ready (exit code 1)")
    assert "root cause: AssertionError (assert failed at server_args.py:" in msg
    assert "topk is None" in msg or "draft is None" in msg
    assert str(tmp_path / "nextn-1.log") in msg


def test_a_command_that_does_not_exist(tmp_path: Path) -> None:
    spec = ServerSpec(name="x", argv=["/no/such/engine-binary", "--port", "{port}"])
    with pytest.raises(ServerStartError, match="cannot run '/no/such/engine-binary'"):
        ServerProcess(spec, tmp_path / "x.log").start()


def test_shell_mode_and_a_child_that_ignores_sigterm(tmp_path: Path, token: str) -> None:
    line = f"exec {sys.executable} -c {shlex.quote(SERVER)} {{port}} 0.1 {token} child"
    spec = ServerSpec(name="sh", engine="llamacpp", shell=True, argv=[line], ready_timeout_s=20)
    p = ServerProcess(spec, tmp_path / "sh.log")
    p.start()
    try:
        p.wait_ready()
        assert len(processes_with(token)) == 2  # the server and its stubborn child
    finally:
        p.stop(grace_s=0.5)  # SIGTERM leaves the child; SIGKILL to the group ends it
    assert processes_with(token) == []


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from tokbench.config import ServerSpec
    from tokbench.server.launch import ServerProcess, terminate_on_sigterm
    spec = ServerSpec(name="d", engine="llamacpp", argv=[sys.executable, "-c", sys.argv[1], "{port}", "0.1",
                      os.environ["TOKEN"]])
    mode = sys.argv[2]
    p = ServerProcess(spec, Path(sys.argv[3]))
    if mode == "exit":  # forget to stop: the atexit hook must
        p.start(); p.wait_ready(); print("ready", flush=True); sys.exit(0)
    with terminate_on_sigterm():
        p.start()
        try:
            p.wait_ready()
            print("ready", flush=True)
            time.sleep(60)
        finally:
            p.stop(grace_s=2)
    """
)


@pytest.mark.parametrize("how", ["sigterm", "sigint", "exit"])
def test_no_orphans_when_tokbench_itself_goes_away(tmp_path: Path, token: str, how: str) -> None:
    mode = "exit" if how == "exit" else "wait"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, SERVER, mode, str(tmp_path / "d.log")],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "TOKEN": token,
        },  # not in the driver's own command line, so the scan sees the server
    )
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "ready"  # the server answered its probe
        if how != "exit":  # (with "exit" the driver is already on its way out)
            assert len(processes_with(token)) == 1
            driver.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        driver.wait(timeout=20)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert_none_left(token)


@pytest.mark.llamacpp
@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--spec-typo", "ngram-simple"], "error: invalid argument: --spec-typo"),
        (
            ["--spec-type", "bogus"],
            'error while handling argument "--spec-type": unknown speculative type: bogus',
        ),
    ],
)
def test_llama_server_bad_flag_is_named_in_its_own_words(tmp_path: Path, extra: list[str], said: str) -> None:
    from tokbench.server.install import install_llamacpp

    engine = install_llamacpp()  # cached after the first build
    argv = [str(engine.server), "-m", str(engine.model), "--port", "{port}", *extra]
    p = ServerProcess(ServerSpec(name="typo", engine="llamacpp", argv=argv), tmp_path / "typo-1.log")
    p.start()
    try:
        with pytest.raises(ServerStartError) as e:
            p.wait_ready(deadline_s=60)
    finally:
        p.stop()
    assert p.triage().root_cause == said
    assert f"root cause: {said}" in str(e.value)
