"""`python -m tokbench.testing` as a subprocess on a free port, with its timeline written at exit: the server
the CLI tests measure, and the ground truth they check figures against."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def reference_server(tmp_path: Path, *args: str) -> Iterator[tuple[str, Path]]:
    """Yields (base URL, timeline path); the timeline exists once the block has left (SIGTERM, then exit)."""
    timeline = tmp_path / "timeline.jsonl"
    cmd = [sys.executable, "-m", "tokbench.testing", "--port", "0", "--timeline-out", str(timeline), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield line.split()[-1], timeline
    finally:
        proc.send_signal(signal.SIGTERM)  # the timeline is written at exit
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
