#!/usr/bin/env python3
"""How much streaming can tokbench's client ingest? (a benchmark script, not a test)

(a) C=256 against the reference server at zero latency (`python -m tokbench.testing`): output tok/s ingested,
    event-loop lag p99, achieved concurrency.
(b) C=64, 2000 requests x 1000 tokens against nginx answering a static SSE stream (never the bottleneck,
    /work/shared/tools/fast-sse-server.sh or --sse-server): tokbench's client against the raw aiohttp loop
    (/work/shared/tools/raw-stream-client.py or --raw-client) in alternating rounds, and their ratio.

Servers run pinned to core 0 and clients to core 1 when the machine has two cores and `taskset`.
usage: python bench/client_capacity.py [--part a|b|both] [--rounds 3] [--requests 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

TOOLS = Path("/work/shared/tools")


def pinned(core: int, cmd: Sequence[str]) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(core), *cmd]
    return list(cmd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(cmd: Sequence[str], ready: str | None = None, port: int | None = None) -> Iterator[str]:
    """Start a server in its own process group; yield its base URL once it is ready; kill the group after."""
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed below, after the process)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if ready else log, stderr=log, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        if ready:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if ready not in line:
                log.seek(0)
                raise SystemExit(f"server did not start: {line!r} {log.read()[-2000:]}")
            url = line.split()[-1]
        else:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port or 0), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        log.seek(0)
                        raise SystemExit(f"server did not start: {log.read()[-2000:]}") from None
                    time.sleep(0.1)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def run_json(cmd: Sequence[str], timeout: float = 900) -> dict[str, Any]:
    """Run a client; its last stdout line is one JSON object."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def tokbench_client(url: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", url, "--concurrency", str(concurrency),
           "--requests", str(requests), "--max-tokens", str(max_tokens)]  # fmt: skip
    return run_json(pinned(1, cmd))


def raw_client(script: Path, url: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, str(script), "--url", url, "--concurrency", str(concurrency),
           "--requests", str(requests), "--max-tokens", str(max_tokens)]  # fmt: skip
    return run_json(pinned(1, cmd))


def worker(url: str, concurrency: int, requests: int, max_tokens: int) -> None:
    """tokbench's client as the CLI drives it (run_sweep: closed loop, every chunk recorded), one trial."""
    from tokbench.config import load_spec
    from tokbench.loadgen.runner import sweep_sync
    from tokbench.stats.summary import trial_figures

    spec = load_spec(base_url=url, concurrencies=(concurrency,), requests=requests, max_tokens=max_tokens,
                     warmup=0, timeout_s=600, stall_timeout_s=60)  # fmt: skip
    cpu0 = time.process_time()
    run = sweep_sync(spec, environment={})
    cpu = time.process_time() - cpu0
    (trial,) = run.levels[0].trials
    f = trial_figures(trial)
    chunks = sum(len(r.chunk_ns) for r in trial.records)
    print(json.dumps({
        "requests": len(trial.records), "ok": f.ok, "tokens": f.tokens, "chunks_recorded": chunks,
        "wall_s": round(f.wall_s, 3), "output_tok_per_s": round(f.agg_tok_s, 1),
        "loop_lag_p99_ms": trial.loop_lag_p99_ms, "loop_lag_max_ms": trial.loop_lag_max_ms,
        "achieved_concurrency": trial.achieved_concurrency, "client_limited": trial.client_limited,
        "cpu_us_per_token": round(cpu / max(f.tokens, 1) * 1e6, 2),
    }))  # fmt: skip


def part_a(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tokbench.testing", "--port", "0", "--ttft-ms", "0", "--itl-ms", "0.001",
           "--batch-slope", "0", "--max-batch", "100000"]  # fmt: skip
    with process(pinned(0, cmd), ready="listening on") as url:
        r = tokbench_client(url, 256, args.requests_a, args.max_tokens)
    print(f"(a) reference server, zero latency, C=256, {r['requests']} x {args.max_tokens} tokens:")
    print(f"    tokbench ingested {r['output_tok_per_s']:,.0f} output tok/s; event-loop lag p99 "
          f"{r['loop_lag_p99_ms']:.1f} ms (max {r['loop_lag_max_ms']:.1f}); achieved concurrency "
          f"{r['achieved_concurrency']:.1f}; client CPU {r['cpu_us_per_token']} us/token; "
          f"ok {r['ok']}")  # fmt: skip
    return r


def part_b(args: argparse.Namespace) -> dict[str, Any]:
    sse = Path(args.sse_server)
    if not shutil.which("nginx"):
        raise SystemExit("part (b) needs nginx: apt-get install -y nginx")
    port = free_port()
    www = tempfile.mkdtemp(prefix="tokbench-sse-")
    os.chmod(www, 0o755)  # nginx's workers run as another user and must reach the files
    tok: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    with process(pinned(0, ["bash", str(sse), str(port), str(args.max_tokens), www]), port=port) as url:
        for i in range(args.rounds):
            # Alternate which client goes first, so drift on a shared machine does not favour one of them.
            order = ("raw", "tokbench") if i % 2 == 0 else ("tokbench", "raw")
            for who in order:
                if who == "raw":
                    raw.append(raw_client(Path(args.raw_client), url, 64, args.requests, args.max_tokens))
                else:
                    tok.append(tokbench_client(url, 64, args.requests, args.max_tokens))
                last = (raw if who == "raw" else tok)[-1]
                print(f"    round {i + 1} {who:>8}: {last['output_tok_per_s']:>10,.0f} tok/s", flush=True)
    t = statistics.median(r["output_tok_per_s"] for r in tok)
    w = statistics.median(r["output_tok_per_s"] for r in raw)
    print(f"(b) nginx static SSE, C=64, {args.requests} x {args.max_tokens} tokens, median of {args.rounds}:")
    print(f"    tokbench {t:,.0f} tok/s (every chunk recorded), raw loop {w:,.0f} tok/s, ratio {t / w:.2f}")
    return {"tokbench_tok_s": t, "raw_tok_s": w, "ratio": round(t / w, 3), "tokbench": tok, "raw": raw}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["a", "b", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000, help="part (b) requests per client run")
    ap.add_argument("--requests-a", type=int, default=512, help="part (a) requests (2 x 256 by default)")
    ap.add_argument("--max-tokens", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=64, help=argparse.SUPPRESS)
    ap.add_argument("--sse-server", default=str(TOOLS / "fast-sse-server.sh"))
    ap.add_argument("--raw-client", default=str(TOOLS / "raw-stream-client.py"))
    ap.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON summary line at the end")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.concurrency, args.requests, args.max_tokens)
        return
    summary: dict[str, Any] = {}
    if args.part in ("a", "both"):
        summary["a"] = part_a(args)
    if args.part in ("b", "both"):
        summary["b"] = part_b(args)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
