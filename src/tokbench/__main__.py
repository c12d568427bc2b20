"""`python -m tokbench` runs the CLI."""

from tokbench.cli import main

main()
