"""CLI: placeholder for the sweep command(s); replaced by the module's owner."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
