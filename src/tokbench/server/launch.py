"""Launch one server configuration: its own process group, output to a log file, readiness, and teardown.

The child gets its own session (so a terminal's Ctrl-C reaches tokbench, which then tears the group down in
order), writes stdout and stderr to one log file (never a pipe nobody reads), and is polled while we wait.
Teardown is SIGTERM to the whole group, SIGKILL after a grace period; an atexit hook catches any left over.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

from tokbench.config import ServerSpec
from tokbench.errors import ServerStartError
from tokbench.server.diagnose import Triage, format_triage, triage
from tokbench.server.engines import ENGINES, http_get

Clock = Callable[[], float]
OnWait = Callable[[float, str], None]  # (seconds since start, last log line)

# Servers started and not yet stopped, for the atexit hook; only touched from the thread that starts them.
_LIVE: set[ServerProcess] = set()
_atexit_installed = False


def _stop_all_at_exit() -> None:
    for proc in list(_LIVE):
        proc.stop(grace_s=2.0)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """True when something listens on host:port. SO_REUSEADDR makes a socket left in TIME_WAIT by the previous
    launch not count, as the servers themselves bind with it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group, read from /proc; [pgid] guess elsewhere."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the parenthesised command: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


class ServerProcess:
    """One launch of one configuration. Use as a context manager, or call start()/stop() in try/finally."""

    def __init__(
        self,
        spec: ServerSpec,
        log_path: Path,
        *,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        environ: dict[str, str] | None = None,
        probe_timeout_s: float = 2.0,
    ) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self._clock = clock
        self._sleep = sleep
        self._environ = environ
        self._probe_timeout_s = probe_timeout_s
        self.port: int | None = spec.port
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started_at: float | None = None
        self._marker_offset = 0
        self._marker_seen = spec.ready_marker is None
        self.ready_after_s: float | None = None

    # ---- identity ------------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server has no port before start()")
        return f"http://{self.spec.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def _fill(self, text: str) -> str:
        # str.replace, not format(): argv may hold JSON with braces (--speculative-config '{"method": 1}')
        return text.replace("{port}", str(self.port)).replace("{host}", self.spec.host)

    def command(self) -> list[str]:
        """The argv handed to the OS (placeholders filled; a shell line wrapped in /bin/sh -c)."""
        argv = [self._fill(a) for a in self.spec.argv]
        return ["/bin/sh", "-c", " ".join(argv)] if self.spec.shell else argv

    # ---- start ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the server. ServerStartError when the port is taken or the command cannot be run."""
        global _atexit_installed
        if self._proc is not None:
            raise RuntimeError(f"{self.spec.name}: already started")
        if self.port is None:
            self.port = free_port(self.spec.host)
        elif port_in_use(self.spec.host, self.port):
            raise ServerStartError(
                f"{self.spec.name}: port {self.port} is already in use (address already in use) before "
                f"launch; stop whatever listens there (`ss -ltnp 'sport = :{self.port}'` shows it), give "
                f"this configuration another port, or pass --port '{{port}}' in argv to let tokbench pick "
                f"one"
            )
        env = dict(os.environ if self._environ is None else self._environ)
        env.update({k: self._fill(v) for k, v in self.spec.env.items()})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop(); the child writes to it meanwhile)
        cmd = self.command()
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: we can signal it whole; Ctrl-C does not reach it
                close_fds=True,
            )
        except OSError as e:
            self._log.close()
            self._log = None
            raise ServerStartError(
                f"{self.spec.name}: cannot run {cmd[0]!r}: {e.strerror or e}; check the first item of argv "
                f"(a full path, or a command on PATH)"
            ) from None
        self._started_at = self._clock()
        _LIVE.add(self)
        if not _atexit_installed:
            atexit.register(_stop_all_at_exit)
            _atexit_installed = True

    # ---- readiness -----------------------------------------------------------------------------------------

    def probe_urls(self) -> list[str]:
        url = self.spec.ready_url
        if url is not None:
            return [self._fill(url) if url.startswith("http") else self.base_url + url]
        return [self.base_url + p for p in ENGINES[self.spec.engine].health_paths]

    def _probe(self) -> bool:
        # For SGLang, a 404 on /health_generate (older builds) falls through to /health.
        for url in self.probe_urls():
            status, _ = http_get(url, self._probe_timeout_s)
            if status == 200:
                return True
            if status != 404:
                return False
        return False

    def _scan_marker(self) -> bool:
        if self._marker_seen:
            return True
        marker = self.spec.ready_marker or ""
        try:
            with open(self.log_path, "rb") as f:
                # re-read a marker's length before the offset, so a marker split across two reads is found
                start = max(0, self._marker_offset - len(marker.encode()))
                f.seek(start)
                chunk = f.read()
        except OSError:
            return False
        self._marker_offset = start + len(chunk)
        self._marker_seen = marker in chunk.decode("utf-8", "replace")
        return self._marker_seen

    def wait_ready(self, deadline_s: float | None = None, on_wait: OnWait | None = None) -> float:
        """Block until the process is alive, the engine's probe answers 200 and the log marker (if any) has
        appeared. Returns seconds since start; ServerStartError with the triage if it exits or times out."""
        if self._proc is None or self._started_at is None:
            raise RuntimeError(f"{self.spec.name}: wait_ready() before start()")
        limit = self.spec.ready_timeout_s if deadline_s is None else deadline_s
        interval = 0.05
        while True:
            if self._proc.poll() is not None:
                raise ServerStartError(self._start_failure("exited before it was ready"))
            probe_ok = self._probe()
            marker_ok = self._scan_marker()
            elapsed = self._clock() - self._started_at
            if probe_ok and marker_ok and self._proc.poll() is None:
                self.ready_after_s = elapsed
                return elapsed
            if elapsed >= limit:
                waiting = "its probe " + " / ".join(self.probe_urls()) if not probe_ok else ""
                if not marker_ok:
                    waiting += (" and " if waiting else "") + f"the log line {self.spec.ready_marker!r}"
                self.stop()
                raise ServerStartError(
                    self._start_failure(
                        f"not ready after {limit:.0f} s (still waiting for {waiting}); stopped"
                    )
                )
            if on_wait is not None:
                on_wait(elapsed, self.last_log_line())
            self._sleep(interval)
            interval = min(interval * 1.5, 1.0)

    def _start_failure(self, what: str) -> str:
        return format_triage(self.triage(), config=self.spec.name, what=what, log_path=str(self.log_path))

    # ---- state ---------------------------------------------------------------------------------------------

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def last_log_line(self, max_bytes: int = 8192) -> str:
        """The last non-empty line (progress bars rewrite with \\r: the last segment counts)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                tail = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        for line in reversed(tail.replace("\r", "\n").splitlines()):
            if line.strip():
                return line.strip()
        return ""

    def triage(self) -> Triage:
        return triage(self.log_text(), self.exit_code)

    # ---- teardown ------------------------------------------------------------------------------------------

    def _signal_group(self, sig: int) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the group, SIGKILL to whatever is left after `grace_s`; idempotent."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        try:
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                self._proc.poll()  # reap the leader, or it stays a member as a zombie
                if not group_members(pgid):
                    break
                time.sleep(0.05)
            else:
                self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5.0)
            # children that ignored SIGTERM but left the leader dead
            if group_members(pgid):
                self._signal_group(signal.SIGKILL)
                end = time.monotonic() + 5.0
                while group_members(pgid) and time.monotonic() < end:
                    time.sleep(0.05)
        finally:
            _LIVE.discard(self)
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """While active (main thread only), SIGTERM raises KeyboardInterrupt, so finally blocks stop the servers
    instead of the interpreter dying with them still running."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
