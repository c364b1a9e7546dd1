"""A real browser for the tests: Debian's Chromium, headless, driven over the DevTools protocol
(a WebSocket, JSON commands) with nothing between the test and the browser. It reaches nothing
but loopback: its background services are off and every other host name resolves to nothing.

    with Browser() as browser:
        browser.open("http://127.0.0.1:PORT/page")
        browser.evaluate("document.title")
        browser.screenshot("page.png")

`chromium_path()` finds it; a test skips without it, unless RADIXRT_REQUIRE_TOOLS=1 (set by
`make test`, whose setup installs it) makes a missing browser a failure.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from required_tools import require_tool
from websockets.sync.client import connect

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
START_TIMEOUT_S = 30.0
LOG_NAME = "chromium.log"  # in the profile's folder
DEVTOOLS_LINE = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_path() -> str:
    found = next((shutil.which(n) for n in CHROMIUM_NAMES if shutil.which(n)), None)
    return require_tool(found, "Chromium", "chromium")


class Browser:
    """One headless Chromium with one page, closed on exit (its profile in a temporary folder).
    Commands wait for their answer; page events are ignored."""

    def __init__(self, width: int = 1280, height: int = 1000) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="radixrt-chromium-")
        self._log = open(Path(self._profile.name) / LOG_NAME, "w")  # noqa: SIM115 (closed in close)
        self._proc = subprocess.Popen(
            [chromium_path(), "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-pings", "--disable-domain-reliability",
             # nothing but loopback: every other host name resolves to nothing
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
             "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--user-data-dir={self._profile.name}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self._log, text=True)
        try:
            browser_url = self._devtools_url()
            port = browser_url.split(":")[2].split("/")[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            self._ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=2**26)
        except BaseException:
            self.close()
            raise
        self._ids = itertools.count(1)

    def _devtools_url(self) -> str:
        """The browser's DevTools address, from its log (a file: never a pipe that fills)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        log = Path(self._profile.name) / LOG_NAME
        while time.monotonic() < deadline:
            match = DEVTOOLS_LINE.search(log.read_text(errors="replace"))
            if match:
                return match.group(1)
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("Chromium did not start: " + log.read_text(errors="replace")[-2000:])

    def command(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, url: str) -> None:
        """Navigate and wait until the document has loaded."""
        self.command("Page.enable")
        self.command("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True,
                              awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll until the expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true in the page: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: str | Path) -> None:
        """A PNG of the whole page."""
        metrics = self.command("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.command("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                            clip={"x": 0, "y": 0, "width": size["width"],
                                  "height": size["height"], "scale": 1})
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
