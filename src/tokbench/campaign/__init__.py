"""Campaigns: preflight every configuration, launch each in turn (interleaved or blocked), measure, tear down,
then compare each configuration with the baseline and write results, comparison and checklist.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import rich.console
import rich.markup

from tokbench.campaign.outputs import (
    Outcome,
    SpecDiagnose,
    checklist,
    load_environment_json,
    write_outputs,
)
from tokbench.campaign.run import (
    Failure,
    Interrupted,
    Runner,
    RunState,
    RunStore,
    failed_attempts_run,
    redact_argv,
    redact_env,
    run_meta,
    to_run,
)
from tokbench.campaign.schedule import CLOSING_SUFFIX, LaunchPlan, describe, schedule
from tokbench.config import Plan
from tokbench.errors import ConfigError
from tokbench.records import RunResult
from tokbench.report.export import write_result_json, write_text_atomic
from tokbench.server.diagnose import Triage
from tokbench.server.engines import changed_flags, config_diff, environment, json_safe
from tokbench.server.launch import terminate_on_sigterm
from tokbench.server.preflight import Finding, preflight_plan
from tokbench.stats.compare import LevelVerdict, compare_runs, verdict_to_dict
from tokbench.stats.summary import METRICS

__all__ = [
    "CampaignResult",
    "Failure",
    "LaunchPlan",
    "check_plan",
    "describe",
    "run_campaign",
    "schedule",
]


@dataclass
class CampaignResult:
    runs: dict[str, RunResult]  # by configuration name (and '<baseline>-closing' for a blocked design)
    verdicts: dict[str, list[LevelVerdict]]  # each configuration vs the baseline
    failures: dict[str, Triage | str]  # configurations that failed to start or lost cells: the last triage
    checklist: str
    out_dir: Path
    outcomes: list[Outcome] = field(default_factory=list)
    drift: list[LevelVerdict] | None = None  # blocked design: the closing baseline run vs the first
    warnings: list[Finding] = field(default_factory=list)
    interrupted: bool = False


def check_plan(plan: Plan, environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Validate what can be checked without launching anything: preflight (PreflightError on an error),
    the closing run's name, the metric. Returns the preflight warnings."""
    if plan.metric not in METRICS:
        # checked now, not when comparing after hours of measuring
        raise ConfigError(f"metric: unknown metric {plan.metric!r}; choose one of {', '.join(METRICS)}")
    if plan.design == "blocked":
        closing = plan.baseline.name + CLOSING_SUFFIX
        if any(c.name == closing for c in plan.configs):
            raise ConfigError(
                f"configs: {closing!r} is the name of the closing baseline run; rename that config"
            )
    return preflight_plan(plan, environ)


def _default_spec_diagnose() -> SpecDiagnose | None:
    try:
        from tokbench.spec import diagnose
    except ImportError:
        return None
    return diagnose


class _Display:
    """A rich status line for what is happening now, plus printed events."""

    def __init__(self, console: rich.console.Console | None, on_event: Callable[[str], None] | None) -> None:
        self.console = console
        self.on_event = on_event
        self._status: Any = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if self.console is None:
            yield
            return
        with self.console.status("starting the campaign") as status:
            self._status = status
            try:
                yield
            finally:
                self._status = None

    def status(self, text: str) -> None:
        if self._status is not None:
            # a server's log line may hold brackets ("[rank0]: ...") that rich would read as markup
            self._status.update(rich.markup.escape(text))

    def emit(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, markup=False, highlight=False)
        if self.on_event is not None:
            self.on_event(text)


def run_campaign(
    plan: Plan,
    out_dir: Path,
    *,
    store: RunStore | None = None,
    console: rich.console.Console | None = None,
    on_event: Callable[[str], None] | None = None,
    spec_diagnose: SpecDiagnose | Literal["auto"] | None = "auto",
    environ: Mapping[str, str] | None = None,
) -> CampaignResult:
    """Run the plan and write its outputs under `out_dir`. Preflight errors raise PreflightError before
    anything starts; a configuration that fails to start or dies is recorded and the campaign goes on.
    Ctrl-C/SIGTERM stops it early: servers are torn down and what was measured is written."""
    warnings = check_plan(plan, environ)
    api_key = None
    if plan.sweep.get("api_key_env"):
        api_key = os.environ.get(plan.sweep["api_key_env"])
        if not api_key:
            raise ConfigError(
                f"sweep.api_key_env: environment variable {plan.sweep['api_key_env']} is not set"
            )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    display = _Display(console, on_event)
    for w in warnings:
        display.emit(f"preflight warning: {w}")
    env = environment()
    write_text_atomic(out_dir / "environment.json", load_environment_json(env))
    write_text_atomic(out_dir / "plan.json", json.dumps(_redacted_plan(plan), indent=1) + "\n")
    states = {c.name: RunState(c.name, c) for c in plan.configs}
    launches = schedule(plan)
    for lp in launches:
        if lp.run not in states:
            states[lp.run] = RunState(lp.run, plan.configs[[c.name for c in plan.configs].index(lp.config)])
    runner = Runner(
        plan, out_dir, store=store, emit=display.emit, status=display.status, api_key=api_key, environment=env
    )
    interrupted = False
    with terminate_on_sigterm(), display.active():
        try:
            for i, lp in enumerate(launches, 1):
                state = states[lp.run]
                if state.given_up or states[lp.config].given_up:
                    display.emit(f"{lp.run}: skipping launch {i}/{len(launches)} (it failed to start before)")
                    continue
                display.status(f"launch {i}/{len(launches)}: {lp.run}")
                runner.launch(state, lp)
                _write_results(out_dir, plan, states[lp.run], env)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
            display.emit("interrupted: servers stopped; writing what was measured")
    return _finish(plan, out_dir, states, launches, warnings, env, store, spec_diagnose, interrupted)


def _redacted_plan(plan: Plan) -> dict[str, Any]:
    d = plan.model_dump(mode="json")
    for c in d["configs"]:
        c["argv"] = redact_argv(c["argv"])
        c["env"] = redact_env(c["env"])
    return d


def _write_results(out_dir: Path, plan: Plan, state: RunState, env: dict[str, Any]) -> None:
    # written after every launch, so a killed campaign still leaves its results; complete only at the end
    if state.trials:
        write_result_json(
            to_run(state, plan, env, complete=False), out_dir / "results" / f"{state.name}.json"
        )
    if state.failed:
        write_result_json(
            failed_attempts_run(state, plan, env), out_dir / "results" / f"{state.name}.failed-attempts.json"
        )


def _finish(
    plan: Plan,
    out_dir: Path,
    states: dict[str, RunState],
    launches: Sequence[LaunchPlan],
    warnings: list[Finding],
    env: dict[str, Any],
    store: RunStore | None,
    spec_diagnose: SpecDiagnose | Literal["auto"] | None,
    interrupted: bool,
) -> CampaignResult:
    """Figures, from the recorded runs only: verdicts vs the baseline, config diffs, spec accounting."""
    seed = int(plan.sweep.get("seed", 0))
    diagnose_fn = _default_spec_diagnose() if isinstance(spec_diagnose, str) else spec_diagnose
    base_state = states[plan.baseline.name]
    expected: dict[str, list[tuple[int, int]]] = {}
    for lp in launches:
        expected.setdefault(lp.run, []).extend(lp.cells)

    runs: dict[str, RunResult] = {}
    outcomes: list[Outcome] = []
    for name, st in states.items():
        failures_unrecovered = [f for f in st.failures if not f.recovered]
        missing = {c for c in expected.get(name, [])} - {(t.concurrency, t.trial) for t in st.trials}
        complete = not interrupted and not missing and not failures_unrecovered
        run = to_run(st, plan, env, complete) if st.trials else None
        if run is not None:
            runs[name] = run
            write_result_json(run, out_dir / "results" / f"{name}.json")
        if st.failed:
            write_result_json(
                failed_attempts_run(st, plan, env), out_dir / "results" / f"{name}.failed-attempts.json"
            )
        if store is not None and st.stored_id is not None:
            store.finish_run(st.stored_id, complete, meta=run_meta(st, plan, env, complete))
        outcomes.append(
            Outcome(
                name=name,
                spec=st.spec,
                baseline=name == plan.baseline.name,
                run=run,
                expected_cells=tuple(expected.get(name, [])),
                failures=list(st.failures),
                warnings=[f"{w.found} (fix: {w.rule.fix})" for w in warnings if w.config == name],
            )
        )

    base_run = runs.get(plan.baseline.name)
    rng = np.random.default_rng([seed, 0xC0])
    verdicts: dict[str, list[LevelVerdict]] = {}
    drift: list[LevelVerdict] | None = None
    for o in outcomes:
        st = states[o.name]
        if o.name != plan.baseline.name and base_state.resolved and st.resolved:
            if st.spec.engine != base_state.spec.engine:
                # different engines share no settings; a key-by-key diff would list everything
                o.diff_note = f"a different engine ({base_state.spec.engine} → {st.spec.engine})"
            else:
                flags = changed_flags(base_state.spec.argv, st.spec.argv, base_state.spec.env, st.spec.env)
                o.diff = config_diff(base_state.resolved, st.resolved, flags)
        if o.baseline or o.run is None or base_run is None:
            continue
        o.verdicts = compare_runs(base_run, o.run, plan.metric, plan.margin_pct, rng=rng)
        if o.name == plan.baseline.name + CLOSING_SUFFIX:
            drift = o.verdicts
            continue
        verdicts[o.name] = o.verdicts
        if diagnose_fn is not None:
            _spec_accounting(o, base_run, diagnose_fn)
        if store is not None and base_state.stored_id and st.stored_id:
            rows = [verdict_to_dict(v) for v in o.verdicts]
            store.add_verdicts(base_state.stored_id, st.stored_id, plan.metric, rows)
    if plan.design == "blocked" and drift is None and len(plan.configs) > 1:
        drift = []  # planned, not measured
    text = checklist(plan, outcomes, drift, interrupted)
    write_outputs(out_dir, plan, outcomes, drift, text)
    failures: dict[str, Triage | str] = {}
    for name, st in states.items():
        bad = [f for f in st.failures if not f.recovered]
        if bad:
            failures[name] = bad[-1].triage or bad[-1].summary
    return CampaignResult(
        runs=runs,
        verdicts=verdicts,
        failures=failures,
        checklist=text,
        out_dir=out_dir,
        outcomes=outcomes,
        drift=drift,
        warnings=warnings,
        interrupted=interrupted,
    )


def _spec_accounting(o: Outcome, base_run: RunResult, diagnose_fn: SpecDiagnose) -> None:
    assert o.run is not None and o.verdicts is not None
    try:
        o.spec_levels = diagnose_fn(
            base_run,
            o.run,
            verdicts={v.concurrency: v.verdict for v in o.verdicts},
            config_diff=[(d.key, json_safe(d.a), json_safe(d.b), d.expected) for d in o.diff],
        )
    except Exception as e:  # the accounting is optional; a bug there must not lose a campaign's results
        o.spec_error = f"{type(e).__name__}: {e}"
