"""A long streamed completion in a thread of its own, for tests that do something to its replica meanwhile."""

from __future__ import annotations

import json
import threading

import httpx

HEADER = "x-llamafleet-replicas"


class StreamThread(threading.Thread):
    """Streams one greedy count of ``max_tokens`` tokens; keeps its status, replica, text, finish reason and the
    message of an error event. :attr:`started` is set at its first token (or when it ends without one)."""

    def __init__(self, url: str, model: str, max_tokens: int = 64) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.started = threading.Event()
        self.status, self.replica, self.text = 0, "", ""
        self.finish: str | None = None
        self.error: str | None = None

    def run(self) -> None:
        body = {"model": self.model, "prompt": "1, 2, 3, 4, 5,", "max_tokens": self.max_tokens, "temperature": 0,
                "stream": True}
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=300) as r:
                self.status, self.replica = r.status_code, r.headers.get(HEADER, "")
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        self.error = event["error"]["message"]
                        continue
                    choice = event["choices"][0]
                    self.text += choice["text"]
                    self.finish = choice["finish_reason"] or self.finish
                    self.started.set()
        finally:
            self.started.set()
