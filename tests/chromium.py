"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for tests that look at a page.

:func:`open_page` starts a fresh Chromium (its own profile folder, the headless flags the project uses),
loads a URL, waits for its load event, and returns a screenshot (PNG bytes) and every console message and
uncaught exception the page produced. It talks to Chromium's DevTools websocket with ``websocket-client``;
no Selenium, no driver binary. :func:`chromium_binary` installs Debian's package when it is missing and the
test runs as root (as the infra scripts install Prometheus), and fails the test otherwise, never skips.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_binary() -> str:
    """Debian's chromium: installed by ``infra/local/chromium.sh`` when missing (root only), else the test fails."""
    found = shutil.which("chromium")
    if found:
        return found
    done = subprocess.run(["bash", str(REPO / "infra" / "local" / "chromium.sh"), "install"], capture_output=True)
    found = shutil.which("chromium")
    if not found:
        pytest.fail(
            "headless Chromium is missing and could not be installed (apt-get install chromium):"
            f" {done.stderr.decode(errors='replace')[-500:]}"
        )
    return found


@dataclass
class Page:
    """What loading a page showed."""

    screenshot: bytes
    console: list[dict[str, Any]] = field(default_factory=list)
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads, as text (empty: a clean page)."""
        out = [
            f"console.{m.get('type')}: {m.get('text')}" for m in self.console if m.get("type") in ("error", "assert")
        ]
        out += [f"exception: {e.get('text')} {e.get('exception', {}).get('description', '')}" for e in self.exceptions]
        return out + [f"failed to load {u}" for u in self.failed_requests]


def open_page(url: str, *, width: int = 1200, height: int = 900, timeout_s: float = 60.0) -> Page:
    """Load ``url`` in a fresh headless Chromium and screenshot the whole page."""
    import websocket

    binary = chromium_binary()
    with tempfile.TemporaryDirectory(prefix="medic-chromium-") as profile:
        proc = subprocess.Popen(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + timeout_s
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("headless Chromium did not open its DevTools port")
                time.sleep(0.05)
            port = int(port_file.read_text().split("\n")[0])
            targets = _get_json(f"http://127.0.0.1:{port}/json/list", deadline)
            page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            ws = websocket.create_connection(page_ws, timeout=timeout_s, suppress_origin=True)
            try:
                return _drive(ws, url, width, deadline)
            finally:
                ws.close()
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()


def _get_json(url: str, deadline: float) -> Any:
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return json.load(answer)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _drive(ws: Any, url: str, width: int, deadline: float) -> Page:
    seq = 0
    page = Page(screenshot=b"")

    def call(method: str, **params: Any) -> dict[str, Any]:
        nonlocal seq
        seq += 1
        ws.send(json.dumps({"id": seq, "method": method, "params": params}))
        while True:
            message = json.loads(ws.recv())
            if message.get("id") == seq:
                if "error" in message:
                    pytest.fail(f"DevTools {method}: {message['error']}")
                return dict(message.get("result", {}))
            _event(message, page)

    call("Runtime.enable")
    call("Log.enable")
    call("Network.enable")
    call("Page.enable")
    call("Page.navigate", url=url)
    loaded = False
    while not loaded:
        if time.monotonic() > deadline:
            pytest.fail(f"{url} did not finish loading")
        message = json.loads(ws.recv())
        loaded = message.get("method") == "Page.loadEventFired"
        _event(message, page)
    metrics = call("Page.getLayoutMetrics")
    full = metrics.get("cssContentSize") or metrics["contentSize"]
    shot = call(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": 0, "y": 0, "width": width, "height": full["height"], "scale": 1},
    )
    page.screenshot = base64.b64decode(shot["data"])
    return page


def _event(message: dict[str, Any], page: Page) -> None:
    method = message.get("method")
    params = message.get("params", {})
    if method == "Runtime.consoleAPICalled":
        text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
        page.console.append({"type": params.get("type"), "text": text})
    elif method == "Log.entryAdded":
        entry = params.get("entry", {})
        if entry.get("level") == "error":
            page.console.append({"type": "error", "text": entry.get("text", "")})
    elif method == "Runtime.exceptionThrown":
        page.exceptions.append(params.get("exceptionDetails", {}))
    elif method == "Network.loadingFailed":
        page.failed_requests.append(str(params.get("requestId")))
