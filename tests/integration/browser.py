"""Headless Chromium (Debian's ``chromium`` package), driven over its DevTools protocol, for tests that use the
dashboard as a person would: open a page, wait for text, click, type, take a screenshot.

The protocol is spoken directly over one WebSocket (the ``websockets`` package): no WebDriver, no browser download.
Clicks and typing are real input events at the element's place on the screen, not JavaScript calls on the element.
A missing Chromium is an error, not a skip: the test command (``scripts/test.sh``) installs it as root
(``apt-get install chromium``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

CHROMIUM = os.environ.get("LLAMAFLEET_CHROMIUM", "/usr/bin/chromium")
# Without the networking flags Chromium keeps trying to reach Google's services, which a closed network refuses.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
         "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
         "--hide-scrollbars", "--remote-debugging-port=0", "--remote-allow-origins=*")
START_TIMEOUT_S = 30.0


class BrowserError(AssertionError):
    """The page did not do what the test waited for, or a script on it failed."""


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        if not Path(CHROMIUM).is_file():
            raise BrowserError(f"Chromium is not installed at {CHROMIUM}: run scripts/test.sh as root (it "
                               "installs Debian's 'chromium' package), sudo apt-get install chromium, or set "
                               "LLAMAFLEET_CHROMIUM to a Chromium binary")
        profile.mkdir(parents=True, exist_ok=True)
        self._id = 0
        self.errors: list[str] = []  # uncaught exceptions and console errors of the page
        with contextlib.ExitStack() as stack:  # whatever started is stopped if the rest fails
            log = stack.enter_context((profile / "chromium.log").open("wb"))
            self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                                          f"--window-size={width},{height}", "about:blank"],
                                         stdout=log, stderr=subprocess.STDOUT)
            stack.callback(self._stop)
            self.ws = stack.enter_context(self._connect(profile / "DevToolsActivePort", log.name))
            for domain in ("Page", "Runtime"):
                self.send(f"{domain}.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False)
            self._stack = stack.pop_all()

    def _connect(self, port_file: Path, log: str) -> ClientConnection:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.is_file() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrowserError(f"Chromium did not start (exit {self.proc.poll()}); see {log}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with httpx.Client(trust_env=False, timeout=10) as http:
            pages = [t for t in http.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]
        return connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=10)

    def _stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One protocol command; its result (events that arrive meanwhile are noted)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self._id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self._note(message)

    def _note(self, event: dict[str, Any]) -> None:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "?"))
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression on the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll until ``expression`` is truthy on the page; its value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.2)
        raise BrowserError(f"waited {timeout:g}s for {expression!r}; last value {value!r}; page errors {self.errors}")

    def text(self, selector: str) -> str:
        return str(self.eval(f"document.querySelector({json.dumps(selector)}).textContent"))

    def click(self, selector: str) -> None:
        """A left click in the middle of the element, as a mouse does it."""
        box = self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView("
                        "{block: 'center'}); const r = e.getBoundingClientRect(); "
                        "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        x, y = box
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        """Click into the field, then type ``text`` into it."""
        self.click(selector)
        self.send("Input.insertText", text=text)

    def screenshot(self, path: Path) -> bytes:
        """A PNG of the whole page (as tall as its content) written to ``path``."""
        height = int(self.eval("document.documentElement.scrollHeight"))
        width = int(self.eval("document.documentElement.clientWidth"))
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        return data
