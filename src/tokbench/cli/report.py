"""CLI: placeholder for the report command(s); replaced by the module's owner."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
