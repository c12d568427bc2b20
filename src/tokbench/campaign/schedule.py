"""Which launches a campaign makes, in which order, and which (level, trial) cells each launch measures.

interleaved: every round starts each configuration once and measures one trial of every level on it, the
configuration order reversed every other round (A B, B A, ...) so drift and warm-up order cancel. blocked: all
trials of A on one launch, then all of B, ..., then the baseline once more to measure drift over the campaign.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokbench.config import Plan
from tokbench.loadgen.runner import trial_order

CLOSING_SUFFIX = "-closing"


@dataclass(frozen=True)
class LaunchPlan:
    """One planned launch: the configuration, the run its trials belong to, and the cells it measures."""

    config: str  # the ServerSpec's name
    run: str  # the run the trials go to (the config's name, or '<baseline>-closing')
    cells: tuple[tuple[int, int], ...]  # (concurrency, trial) in execution order
    round: int | None = None  # interleaved: the round; blocked: None


def schedule(plan: Plan) -> list[LaunchPlan]:
    """The campaign's launches in order."""
    order = trial_order(plan.load_spec("http://127.0.0.1:1"))
    if plan.design == "blocked":
        launches = [LaunchPlan(c.name, c.name, tuple(order)) for c in plan.configs]
        if len(plan.configs) > 1:
            base = plan.baseline.name
            launches.append(LaunchPlan(base, base + CLOSING_SUFFIX, tuple(order)))
        return launches
    launches = []
    for r in range(plan.rounds):
        configs = list(plan.configs)
        if plan.alternate and r % 2 == 1:
            configs.reverse()
        cells = tuple(cell for cell in order if cell[1] == r)
        launches.extend(LaunchPlan(c.name, c.name, cells, r) for c in configs)
    return launches


def describe(launches: list[LaunchPlan]) -> list[str]:
    """One line per launch, for `tokbench campaign check`."""
    lines = []
    for i, lp in enumerate(launches, 1):
        where = f"round {lp.round + 1}" if lp.round is not None else "all trials"
        if lp.run != lp.config:
            where = "closing baseline run (drift)"
        cells = ", ".join(f"C={c}#{t + 1}" for c, t in lp.cells)
        lines.append(f"{i:3d}. {lp.config:<20} {where}: {cells}")
    return lines
