"""`python -m tokbench.testing`: run the reference server as a process (campaign and CLI tests launch it).

The first stdout line is `listening on http://HOST:PORT` (flushed); SIGTERM or SIGINT stop it cleanly
(exit 0), writing `--timeline-out` if given. Bad flags exit 2 with `error: ...` naming the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import traceback
from collections.abc import Sequence

from tokbench.errors import ConfigError
from tokbench.testing.personalities import READY_LINE
from tokbench.testing.server import ReferenceServer
from tokbench.testing.settings import PERSONALITIES, ServerConfig, parse_accept, parse_fault_rates


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tokbench.testing",
        description="tokbench's reference OpenAI-compatible streaming server (the ground truth for tests).",
    )
    d = ServerConfig()
    ap.add_argument("--host", default=d.host)
    ap.add_argument(
        "--port", type=int, default=d.port, help="0 picks a free port (printed on the first line)"
    )
    ap.add_argument("--model", default=d.model, help="the id /v1/models reports")
    ap.add_argument("--personality", choices=PERSONALITIES, default=d.personality)
    ap.add_argument("--ttft-ms", type=float, default=d.ttft_ms, help="prefill time of an empty prompt")
    ap.add_argument("--prefill-ms-per-token", type=float, default=d.prefill_ms_per_token)
    ap.add_argument("--itl-ms", type=float, default=d.itl_ms, help="decode step time with one request")
    ap.add_argument(
        "--batch-slope", type=float, default=d.batch_slope, help="step-time growth per extra request"
    )
    ap.add_argument("--max-batch", type=int, default=d.max_batch, help="more requests than this queue")
    ap.add_argument("--tokens-per-chunk", type=int, default=d.tokens_per_chunk)
    ap.add_argument("--speed", type=float, default=d.speed, help="divides every modelled duration")
    ap.add_argument("--noise", type=float, default=d.noise, help="run-to-run CV of the speed, e.g. 0.015")
    ap.add_argument("--step-jitter", type=float, default=d.step_jitter, help="per-step CV of the step time")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument(
        "--natural-max", type=int, default=d.natural_max, help="longest natural answer (no ignore_eos)"
    )
    ap.add_argument(
        "--diverge-at", type=int, default=None, help="output text differs from this token position on"
    )
    ap.add_argument(
        "--fault-rate",
        action="append",
        default=[],
        metavar="KIND=RATE",
        help="http_500, http_429, disconnect, stall, malformed, error_event; repeatable",
    )
    ap.add_argument("--stall-s", type=float, default=d.stall_s, help="how long a stall fault stops sending")
    ap.add_argument("--die-after", type=int, default=None, help="exit hard after N finished requests")
    ap.add_argument(
        "--fail-start", default=None, metavar="MESSAGE", help="crash at start with AssertionError"
    )
    ap.add_argument("--load-time-s", type=float, default=d.load_time_s, help="health answers 503 this long")
    ap.add_argument("--spec-accept", default="", help="per-position acceptance, e.g. 0.8,0.6,0.4 (k = count)")
    ap.add_argument("--spec-step-cost", type=float, default=d.spec_step_cost, help="spec step / plain step")
    ap.add_argument("--spec-cost-slope", type=float, default=d.spec_cost_slope)
    ap.add_argument(
        "--per-request-spec-decode-metrics",
        action="store_true",
        help="vllm personality: metrics.speculative_decoding in each response's last event",
    )
    ap.add_argument("--timeline-out", default=None, help="write the timeline as JSONL here at exit")
    return ap


def config_from_args(ns: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        personality=ns.personality,
        ttft_ms=ns.ttft_ms,
        prefill_ms_per_token=ns.prefill_ms_per_token,
        itl_ms=ns.itl_ms,
        batch_slope=ns.batch_slope,
        max_batch=ns.max_batch,
        tokens_per_chunk=ns.tokens_per_chunk,
        speed=ns.speed,
        noise=ns.noise,
        step_jitter=ns.step_jitter,
        seed=ns.seed,
        natural_max=ns.natural_max,
        diverge_at=ns.diverge_at,
        faults=parse_fault_rates(ns.fault_rate),
        stall_s=ns.stall_s,
        die_after=ns.die_after,
        hard_exit=True,
        fail_start=ns.fail_start,
        load_time_s=ns.load_time_s,
        spec_accept=parse_accept(ns.spec_accept),
        spec_step_cost=ns.spec_step_cost,
        spec_cost_slope=ns.spec_cost_slope,
        spec_request_metrics=ns.per_request_spec_decode_metrics,
        timeline_out=ns.timeline_out,
    )


def _check_startup(cfg: ServerConfig) -> None:
    # Crashes the way an engine's argument check does, so triage has a real traceback to find.
    assert cfg.fail_start is None, cfg.fail_start


def _fail_start(cfg: ServerConfig) -> int:
    print(f"INFO: loading model {cfg.model} ({cfg.personality} personality)", file=sys.stderr, flush=True)
    try:
        _check_startup(cfg)
    except AssertionError:
        traceback.print_exc()
        sys.stderr.flush()
    return 1


async def serve(cfg: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with ReferenceServer(cfg) as srv:
        print(f"listening on {srv.base_url}", flush=True)
        if cfg.load_time_s > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.load_time_s)
        if not stop.is_set():
            print(READY_LINE[cfg.personality].format(url=srv.base_url), flush=True)
            await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(ns)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg.fail_start is not None:
        return _fail_start(cfg)
    try:
        asyncio.run(serve(cfg))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
