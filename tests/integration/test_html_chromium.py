"""The HTML report opens in headless Chromium (Debian's `chromium`) with no console errors, plots drawn.

Driven over the DevTools protocol (aiohttp websocket): console calls, exceptions and browser log entries
(CSP violations, failed loads) are collected; the plots are checked by their laid-out geometry and by the
pixels of a screenshot. A control page with deliberate errors proves the collection sees errors at all.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from PIL import Image

from tokbench.records import RequestRecord, RunMeta, RunResult, TrialResult, group_trials
from tokbench.report.html import html_report
from tokbench.report.plots import COLORS
from tokbench.stats.compare import compare_runs

pytestmark = pytest.mark.chromium

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1280,900",
)  # fmt: skip
STEP_TIMEOUT_S = 30.0

PLOT_GEOMETRY = """(() => {
  const out = {};
  for (const s of document.querySelectorAll('section')) {
    out[s.id] = [...s.querySelectorAll('svg')].map(svg => {
      const r = svg.getBoundingClientRect();
      const paths = [...svg.querySelectorAll('path')];
      const drawn = paths.filter(p => { try { return p.getTotalLength() > 0; } catch (e) { return false; } });
      return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height,
              paths: paths.length, drawn: drawn.length, texts: svg.querySelectorAll('text').length};
    });
  }
  return JSON.stringify(out);
})()"""


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        msg = "chromium is not installed (Debian: apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + "; CI must install it")
        pytest.skip(msg)
    return found


class Cdp:
    """A minimal DevTools-protocol client on one page target: calls, and every event kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def _read(self) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.ws.receive(), timeout=STEP_TIMEOUT_S)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"DevTools connection ended: {msg.type}")
        data: dict[str, Any] = json.loads(msg.data)
        return data

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        call_id = self.next_id
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            data = await self._read()
            if data.get("id") == call_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                result: dict[str, Any] = data.get("result", {})
                return result
            self.events.append(data)

    async def wait_for(self, method: str) -> dict[str, Any]:
        while True:
            for e in self.events:
                if e.get("method") == method:
                    self.events.remove(e)
                    return e
            self.events.append(await self._read())

    async def open(self, url: str) -> None:
        self.events.clear()
        await self.call("Page.navigate", url=url)
        await self.wait_for("Page.loadEventFired")
        await self.call("Runtime.evaluate", expression="document.readyState")  # flush what came with load

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                args = [a.get("value", a.get("description")) for a in p["args"]]
                out.append(f"console.{p['type']}: {args}")
            elif method == "Runtime.exceptionThrown":
                details = p["exceptionDetails"]
                described = details.get("exception", {}).get("description")
                out.append(f"exception: {described or details.get('text')}")
            elif method == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['source']}: {p['entry']['text']}")
        return out


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Cdp]:
    binary = chromium_binary()
    profile = tmp_path / "profile"
    log = (tmp_path / "chromium.log").open("w")
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None, f"chromium exited: {(tmp_path / 'chromium.log').read_text()[-2000:]}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        timeout = aiohttp.ClientTimeout(total=STEP_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
            page = next(t for t in targets if t.get("type") == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                cdp = Cdp(ws)
                for domain in ("Page", "Runtime", "Log"):
                    await cdp.call(f"{domain}.enable")
                yield cdp
    finally:
        # Chromium runs a process tree: stop the whole group we started.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


def make_run(label: str, speed: float, seed: int, levels: tuple[int, ...] = (1, 2, 4, 8)) -> RunResult:
    """Three interleaved trials per level of a batching-like server: ITL grows with concurrency, noisy."""
    rng = np.random.default_rng(seed)
    trials = []
    for order, (k, c) in enumerate((k, c) for k in range(3) for c in levels):
        t0 = 10**12 + order * 10**10
        itl_ns = int((10 + 0.5 * c) / speed * rng.uniform(0.95, 1.05) * 1e6)
        records = []
        for slot in range(c):
            for n in range(2):
                sent = t0 + slot * 10**6 + n * (30 * 10**6 + 40 * itl_ns)
                chunks = tuple(sent + int(rng.uniform(25, 40) * 1e6) + i * itl_ns for i in range(40))
                records.append(
                    RequestRecord(
                        index=2 * slot + n, prompt_id=f"p{slot}-{n}", scheduled_ns=sent, sent_ns=sent,
                        end_ns=chunks[-1] + 10**5, first_token_ns=chunks[0], chunk_ns=chunks,
                        chunk_tokens=(1,) * 40, completion_tokens=40,
                    )
                )  # fmt: skip
        end = max(r.end_ns for r in records)
        trials.append(TrialResult(c, k, order, 1.78e9 + order, t0, end, tuple(records)))
    meta = RunMeta(
        f"run-{label}", label, "0.1.0", "2026-11-01T10:00:00+00:00", model="m",
        server={"engine": "llamacpp", "argv": ["llama-server", label]}, environment={"host": "box"},
    )  # fmt: skip
    return RunResult(meta, group_trials(trials))


def report_file(tmp_path: Path) -> Path:
    base = make_run("base", speed=1.0, seed=0)
    spec = make_run("ngram", speed=1.08, seed=1)
    verdicts = {"ngram vs base": compare_runs(base, spec, rng=np.random.default_rng(0))}
    per_position = {"ngram": {1: [0.8, 0.6, 0.4], 8: [0.7, 0.5, 0.3]}}
    path = tmp_path / "report.html"
    path.write_text(html_report([base, spec], verdicts, spec=per_position), encoding="utf-8")
    return path


def color_pixels(png: bytes, hex_color: str) -> int:
    target = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)
    return int((np.abs(pixels - target).sum(axis=2) < 40).sum())


async def test_report_opens_without_errors_and_draws_its_plots(browser: Cdp, tmp_path: Path) -> None:
    # Control: the collector must see a console error, an uncaught exception and a blocked load.
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="img-src \'none\'">'
        '<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">'
        '<script>console.error("boom"); nope();</script>'
    )
    await browser.open(bad.as_uri())
    seen = " | ".join(browser.errors())
    assert "boom" in seen and "nope" in seen and "Content Security Policy" in seen, seen

    await browser.open(report_file(tmp_path).as_uri())
    assert browser.errors() == []

    result = await browser.call("Runtime.evaluate", expression=PLOT_GEOMETRY, returnByValue=True)
    plots = json.loads(result["result"]["value"])
    for section in ("throughput", "tradeoff", "latency", "speculative"):
        [svg] = plots[section]
        assert svg["w"] > 300 and svg["h"] > 150, (section, svg)
        assert svg["drawn"] >= 4 and svg["texts"] >= 4, (section, svg)

    # Pixels: both runs' lines are on screen in the throughput plot.
    svg = plots["throughput"][0]
    shot = await browser.call(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": svg["x"], "y": svg["y"], "width": svg["w"], "height": svg["h"], "scale": 1},
    )
    png = base64.b64decode(shot["data"])
    assert color_pixels(png, COLORS[0]) > 100 and color_pixels(png, COLORS[1]) > 100
