"""The `tokbench` command: one click group; each subcommand lives in a module named for it.

Library errors become a message on stderr and the error's exit code here, and nowhere else.
"""

from __future__ import annotations

import sys

import click

from tokbench import __version__
from tokbench.errors import TokbenchError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TokbenchError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="tokbench")
def main() -> None:
    """Did this serving change help, at which concurrency, by how much, beyond noise, and why?"""


def _register() -> None:
    # Imported here so that `import tokbench.cli` stays cheap and each command module owns its command.
    from tokbench.cli import campaign, compare, demo, engines, report, runs, spec, sweep

    for module in (sweep, compare, campaign, spec, engines, demo, runs, report):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
