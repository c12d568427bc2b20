"""CLI: placeholder for the spec command(s); replaced by the module's owner."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
