"""Executing a campaign: launch, wait for ready, capture the resolved configuration, measure cells, tear down;
restart once and re-run only the cell a dying server spoiled. Figures are computed afterwards (outputs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

from tokbench import __version__
from tokbench.campaign.schedule import LaunchPlan
from tokbench.config import LoadSpec, Plan, ServerSpec
from tokbench.errors import ConfigError, ServerStartError
from tokbench.loadgen.client import StreamClient, fetch_text, resolve_model
from tokbench.loadgen.runner import Progress, run_trial, run_warmup
from tokbench.records import ErrorKind, RequestRecord, RunMeta, RunResult, TrialResult, group_trials
from tokbench.report.export import write_text_atomic
from tokbench.server.diagnose import Triage
from tokbench.server.engines import ENGINES, capture_resolved, engine_version
from tokbench.server.launch import ServerProcess
from tokbench.workload import PromptSource, load_prompts

Emit = Callable[[str], None]
Status = Callable[[str], None]


class RunStore(Protocol):
    """The part of tokbench.store.Store a campaign writes to."""

    def begin_run(self, meta: RunMeta) -> str: ...
    def add_record(self, run_id: str, concurrency: int, trial: int, record: RequestRecord) -> None: ...
    def add_trial(self, run_id: str, trial: TrialResult) -> None: ...
    def finish_run(self, run_id: str, complete: bool = True, meta: RunMeta | None = None) -> None: ...
    def add_verdicts(
        self, run_a: str, run_b: str, metric: str, verdicts: Iterable[Mapping[str, Any]]
    ) -> None: ...


@dataclass
class Failure:
    """A launch that did not become ready, or a server that died while measured."""

    config: str
    kind: Literal["start", "crash"]
    summary: str  # the root-cause line, or what went wrong
    log: str  # path relative to the campaign directory
    triage: Triage | None = None
    cell: tuple[int, int] | None = None  # crash: the (concurrency, trial) being measured
    recovered: bool = False  # crash: the restart worked and the cell was re-run
    timed_out: bool = False  # start: alive but not ready before the deadline


@dataclass
class RunState:
    """Everything one run (a configuration, or the closing baseline) accumulates over its launches."""

    name: str
    spec: ServerSpec
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: str = ""
    trials: list[TrialResult] = field(default_factory=list)  # what the figures use
    failed: list[TrialResult] = field(default_factory=list)  # attempts spoiled by a dying server (data)
    launches: list[dict[str, Any]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    resolved: dict[str, Any] | None = None
    engine_version: str | None = None
    model: str | None = None
    load: dict[str, Any] | None = None
    base_url: str = ""
    stored_id: str | None = None
    order: int = 0
    given_up: bool = False  # failed to start: later launches of it are skipped

    def next_order(self) -> int:
        self.order += 1
        return self.order - 1


_SECRET_FLAG = re.compile(r"(key|token|secret|password|passwd|auth)", re.I)


def redact_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """argv with the values of secret-looking flags (--api-key X, --hf-token=X) replaced."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif tok.startswith("-") and _SECRET_FLAG.search(tok.split("=", 1)[0]):
            if "=" in tok:
                out.append(tok.split("=", 1)[0] + "=***")
            else:
                out.append(tok)
                hide_next = True
        else:
            out.append(tok)
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if _SECRET_FLAG.search(k) else v) for k, v in env.items()}


def run_meta(state: RunState, plan: Plan, environment: dict[str, Any], complete: bool) -> RunMeta:
    spec = state.spec
    return RunMeta(
        run_id=state.run_id,
        label=f"{plan.name}:{state.name}" if plan.name else state.name,
        tool_version=__version__,
        started_at=state.started_at or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        base_url=state.base_url,
        api=str((state.load or {}).get("api", plan.sweep.get("api", "chat"))),
        model=state.model or "",
        load=state.load or {},
        server={
            "name": spec.name,
            "engine": spec.engine,
            "argv": redact_argv(spec.argv),
            "env": redact_env(spec.env),
            "shell": spec.shell,
            "resolved": state.resolved or {},
            "engine_version": state.engine_version,
            "launches": state.launches,
            "failed_attempts": [
                {"concurrency": t.concurrency, "trial": t.trial, "order": t.order} for t in state.failed
            ],
        },
        environment=environment,
        complete=complete,
    )


def to_run(state: RunState, plan: Plan, environment: dict[str, Any], complete: bool) -> RunResult:
    return RunResult(run_meta(state, plan, environment, complete), group_trials(state.trials))


def failed_attempts_run(state: RunState, plan: Plan, environment: dict[str, Any]) -> RunResult:
    meta = dataclasses.replace(
        run_meta(state, plan, environment, complete=False), run_id=state.run_id + "-failed"
    )
    return RunResult(meta, group_trials(state.failed))


# ---- what a dying server looks like in the records -------------------------------------------------------

_LOST = (ErrorKind.CONNECT, ErrorKind.DISCONNECT)


def spoiled(trial: TrialResult, alive: bool) -> bool:
    """Did the server's death (or disappearance) spoil this trial? Dead with any failed request, or alive
    but unreachable for at least half of them."""
    measured = trial.measured
    if not measured:
        return not alive
    failed = sum(1 for r in measured if not r.ok)
    lost = sum(1 for r in measured if r.error_kind in _LOST)
    return (failed > 0) if not alive else lost * 2 >= len(measured)


# A server that refused or dropped connections is often on its way out; give it this long to show it.
SETTLE_S = 2.0


def alive_after(proc: ServerProcess, trial: TrialResult, settle_s: float = SETTLE_S) -> bool:
    """Whether the server still runs after `trial`; when the trial lost connections, wait up to `settle_s`
    for a dying process to exit rather than judge it alive in its last milliseconds."""
    if any(r.error_kind in _LOST for r in trial.measured):
        deadline = time.monotonic() + settle_s
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    return proc.alive()


class Interrupted(Exception):
    """Ctrl-C or SIGTERM while measuring: the campaign stops and writes what it has."""


# ---- one launch --------------------------------------------------------------------------------------------


@dataclass
class Session:
    """A ready server and the client measuring it, inside one event loop."""

    proc: ServerProcess
    spec: LoadSpec
    client: StreamClient


class Runner:
    """Carries the campaign's shared pieces through its launches."""

    def __init__(
        self,
        plan: Plan,
        out_dir: Path,
        *,
        store: RunStore | None,
        emit: Emit,
        status: Status,
        api_key: str | None,
        environment: dict[str, Any],
    ) -> None:
        self.plan = plan
        self.environment = environment
        self.out_dir = out_dir
        self.store = store
        self.emit = emit
        self.status = status
        self.api_key = api_key
        self.source: PromptSource = load_prompts(plan.load_spec("http://127.0.0.1:1"))
        self.launch_counts: dict[str, int] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cancelled = False

    # ---- process lifecycle ---------------------------------------------------------------------------------

    def _log_path(self, config: str) -> tuple[Path, str]:
        n = self.launch_counts.get(config, 0) + 1
        self.launch_counts[config] = n
        rel = f"logs/{config}-{n}.log"
        return self.out_dir / rel, rel

    def start_server(self, state: RunState, why: str) -> ServerProcess | None:
        """Launch and wait for ready; on failure record it (kind 'start') and return None."""
        spec = state.spec
        path, rel = self._log_path(spec.name)
        proc = ServerProcess(spec, path)
        n = self.launch_counts[spec.name]
        self.emit(f"{state.name}: launch {n} ({why}); log {rel}")
        entry: dict[str, Any] = {"launch": n, "log": rel, "why": why, "run": state.name}
        state.launches.append(entry)

        def waiting(elapsed: float, line: str) -> None:
            self.status(f"starting {spec.name} (launch {n}): {elapsed:.0f} s  {line[:100]}")

        try:
            proc.start()
            entry["base_url"] = proc.base_url
            entry["ready_after_s"] = round(proc.wait_ready(on_wait=waiting), 3)
        except ServerStartError as e:
            proc.stop(self.plan.stop_grace_s)
            t = proc.triage() if proc.pid is not None else None
            first = str(e).splitlines()[0]
            timed_out = t is not None and "not ready after" in first
            summary = (t.root_cause if t and t.root_cause else first.split(": ", 1)[-1]) or str(e)
            if timed_out and t is not None:
                summary = first.split(": ", 1)[-1] + (
                    f"; last error line: {t.root_cause}" if t.root_cause else ""
                )
            state.failures.append(Failure(spec.name, "start", summary, rel, t, timed_out=timed_out))
            entry["failure"] = summary
            entry["exit"] = t.exit_description if t else None
            self.emit(str(e))
            return None
        except BaseException:
            proc.stop(self.plan.stop_grace_s)
            raise
        self.emit(f"{state.name}: ready after {entry['ready_after_s']:.1f} s at {proc.base_url}")
        state.base_url = state.base_url or proc.base_url
        if state.resolved is None:
            log_text = proc.log_text()
            state.resolved = capture_resolved(proc.base_url, spec.engine, log_text)
            state.engine_version = engine_version(spec.engine, state.resolved, log_text)
            write_text_atomic(
                self.out_dir / "resolved" / f"{state.name}.json",
                json.dumps(state.resolved, indent=1, default=str) + "\n",
            )
        return proc

    def stop_server(self, state: RunState, proc: ServerProcess) -> None:
        proc.stop(self.plan.stop_grace_s)
        for entry in reversed(state.launches):
            if entry.get("log") == str(proc.log_path.relative_to(self.out_dir)):
                entry["exit"] = proc.triage().exit_description
                break

    # ---- async pieces, each run to completion on the launch's loop -----------------------------------------

    def _run(self, coro: Any) -> Any:
        """Run one coroutine on the launch's loop. Ctrl-C / SIGTERM meanwhile cancel it (run_trial then
        returns what finished); a cancellation anywhere else becomes Interrupted."""
        assert self.loop is not None
        task = self.loop.create_task(coro)
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                handler = signal.getsignal(sig)
                self.loop.add_signal_handler(sig, self._cancel, task)
                previous[sig] = handler
        try:
            return self.loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise Interrupted("cancelled") from None
        finally:
            for sig, handler in previous.items():
                self.loop.remove_signal_handler(sig)
                # remove_signal_handler leaves SIG_DFL for SIGTERM; put back the handler that turns it into
                # KeyboardInterrupt, or a later SIGTERM would kill tokbench with its servers still running
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _cancel(self, task: asyncio.Task[Any]) -> None:
        self.cancelled = True
        task.cancel()

    @contextlib.contextmanager
    def session(self, state: RunState, proc: ServerProcess) -> Iterator[Session]:
        """A client against a ready server (model resolved, warmed up); closed on exit."""
        spec = self.plan.load_spec(proc.base_url, label=state.name)
        if spec.model is None:
            try:
                model = self._run(resolve_model(proc.base_url, self.api_key))
            except ConfigError:
                if spec.api != "sglang":
                    raise
                model = ""  # SGLang's /generate needs no model name
            spec = spec.model_copy(update={"model": model})
        state.model = state.model or spec.model
        if state.load is None:
            state.load = spec.model_dump(mode="json")
        client = StreamClient(spec, self.api_key)
        self._run(client.__aenter__())
        try:
            yield Session(proc, spec, client)
        finally:
            self._run(client.__aexit__(None, None, None))

    def warmup(self, s: Session) -> list[RequestRecord]:
        if s.spec.warmup <= 0:
            return []
        self.status(f"{s.proc.spec.name}: warming up ({s.spec.warmup} requests)")
        recs: list[RequestRecord] = self._run(run_warmup(s.client, s.spec, self.source))
        return recs

    def measure(self, state: RunState, s: Session, cell: tuple[int, int], retry: bool) -> TrialResult:
        c, t = cell
        store, run_id = self.store, state.stored_id

        def on_record(rec: RequestRecord) -> None:
            if store is not None and run_id is not None:
                store.add_record(run_id, c, t, rec)

        def on_progress(p: Progress) -> None:
            self.status(
                f"{state.name} C={c} trial {t + 1}{' (retry)' if retry else ''}: "
                f"{p.done}/{p.total} done, {p.errors} errors"
            )

        metrics_path = ENGINES[state.spec.engine].metrics_path
        base_url = s.proc.base_url

        async def scrape() -> str | None:
            return await fetch_text(base_url, metrics_path) if metrics_path else None

        trial: TrialResult = self._run(
            run_trial(
                s.client,
                s.spec,
                self.source,
                c,
                t,
                state.next_order(),
                on_record=on_record,
                on_progress=on_progress,
                scrape=scrape,
            )
        )
        return dataclasses.replace(trial, retry=True) if retry else trial

    # ---- a launch ------------------------------------------------------------------------------------------

    def launch(self, state: RunState, lp: LaunchPlan) -> None:
        """Start the server, measure the launch's cells, stop it. A server that dies spoils at most one cell:
        that attempt is kept apart, the server restarted once, and the cell re-run."""
        why = f"round {lp.round + 1}" if lp.round is not None else "all trials"
        if lp.run != lp.config:
            why = "closing baseline run"
        proc = self.start_server(state, why)
        if proc is None:
            state.given_up = True
            return
        if not state.started_at:
            state.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.loop = asyncio.new_event_loop()
        try:
            self._measure_cells(state, proc, list(lp.cells))
        finally:
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()
                self.loop = None

    def _begin_store(self, state: RunState) -> None:
        if self.store is not None and state.stored_id is None:
            meta = run_meta(state, self.plan, self.environment, complete=False)
            state.stored_id = self.store.begin_run(meta)

    def _measure_cells(self, state: RunState, proc: ServerProcess, cells: list[tuple[int, int]]) -> None:
        queue = [(cell, False) for cell in cells]
        current: ServerProcess | None = proc
        try:
            while queue and current is not None:
                current = self._measure_on(state, current, queue)
        finally:
            if current is not None:
                self.stop_server(state, current)

    def _measure_on(
        self, state: RunState, proc: ServerProcess, queue: list[tuple[tuple[int, int], bool]]
    ) -> ServerProcess | None:
        """Measure queued cells (popping them) on one running server. Returns the server to go on with (a
        restarted one after a crash), or the same one with the queue emptied when this launch must stop."""
        try:
            session = self.session(state, proc)
            s = session.__enter__()
        except ConfigError as e:
            rel = str(proc.log_path.relative_to(self.out_dir))
            state.failures.append(Failure(state.spec.name, "start", str(e), rel))
            self.emit(f"{state.name}: {e}")
            state.given_up = True
            queue.clear()
            return proc
        try:
            self._begin_store(state)  # once the session knows the model and the load
            warm = self.warmup(s)
            while queue:
                cell, retry = queue[0]
                if not proc.alive():
                    return self._restart(state, proc, None, queue)
                trial = self.measure(state, s, cell, retry)
                if warm:
                    # warmup records ride in the launch's first trial, flagged, so figures skip them
                    trial = dataclasses.replace(trial, records=(*warm, *trial.records))
                    warm = []
                if trial.interrupted and self.cancelled:
                    self._set_aside(state, trial)  # partial: kept as data, not used for figures
                    raise Interrupted(f"{state.name} C={cell[0]} trial {cell[1] + 1}")
                alive = alive_after(proc, trial)
                if spoiled(trial, alive):
                    self._set_aside(state, trial)
                    if retry:
                        return self._give_up(state, proc, cell, queue)
                    return self._restart(state, proc, cell, queue)
                self._keep(state, trial)
                queue.pop(0)
                if retry:
                    self._recovered(state, cell)
                if not alive and queue:
                    return self._restart(state, proc, None, queue)
        finally:
            session.__exit__(None, None, None)
        return proc

    def _keep(self, state: RunState, trial: TrialResult) -> None:
        state.trials.append(trial)
        if self.store is not None and state.stored_id is not None:
            self.store.add_trial(state.stored_id, trial)

    def _set_aside(self, state: RunState, trial: TrialResult) -> None:
        trial = dataclasses.replace(trial, interrupted=True)
        state.failed.append(trial)
        if self.store is not None and state.stored_id is not None:
            self.store.add_trial(state.stored_id, trial)

    def _crash(self, state: RunState, proc: ServerProcess, cell: tuple[int, int] | None) -> Failure:
        self.stop_server(state, proc)
        t = proc.triage()
        rel = str(proc.log_path.relative_to(self.out_dir))
        summary = t.root_cause or f"the server exited ({t.exit_description})"
        crash = Failure(state.spec.name, "crash", summary, rel, t, cell)
        state.failures.append(crash)
        return crash

    def _restart(
        self,
        state: RunState,
        proc: ServerProcess,
        cell: tuple[int, int] | None,
        queue: list[tuple[tuple[int, int], bool]],
    ) -> ServerProcess | None:
        """The server died (while measuring `cell`, or between cells): record the crash and restart once;
        the spoiled cell goes back to the head of the queue as a retry."""
        crash = self._crash(state, proc, cell)
        where = f" at C={cell[0]} trial {cell[1] + 1}" if cell else " between cells"
        self.emit(
            f"{state.name}: server died{where} ({crash.triage.exit_description if crash.triage else '?'}): "
            f"{crash.summary}; restarting once"
        )
        new = self.start_server(state, f"restart after a crash{where}")
        if new is None:
            queue.clear()
            return None
        if cell is None:
            crash.recovered = True
        else:
            queue[0] = (cell, True)
        return new

    def _give_up(
        self,
        state: RunState,
        proc: ServerProcess,
        cell: tuple[int, int],
        queue: list[tuple[tuple[int, int], bool]],
    ) -> ServerProcess | None:
        self._crash(state, proc, cell)
        self.emit(
            f"{state.name}: the re-run of C={cell[0]} trial {cell[1] + 1} failed too; "
            f"skipping the rest of this launch ({len(queue) - 1} more cells)"
        )
        queue.clear()
        return None

    def _recovered(self, state: RunState, cell: tuple[int, int]) -> None:
        for f in reversed(state.failures):
            if f.kind == "crash" and f.cell == cell:
                f.recovered = True
                break
        self.emit(f"{state.name}: C={cell[0]} trial {cell[1] + 1} re-run after the restart")
