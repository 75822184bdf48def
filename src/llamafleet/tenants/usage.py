"""What each key used: Prometheus counters labelled by the key's name (never the key), and a table per key and UTC
day (requests, prompt tokens, of them cached, completion tokens, refusals) that ``GET /v1/usage`` reads and that
survives restarts in a small SQLite file (written every few seconds and at shutdown, by :meth:`Usage.flush`)."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from llamafleet.fleet.telemetry import FleetMetrics

log = logging.getLogger(__name__)
COLUMNS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "refused")


@dataclass
class Day:
    """One key's use on one UTC day."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    refused: int = 0


class Usage:
    """Counts per key name; ``wall``: Unix time (for the day)."""

    def __init__(self, metrics: FleetMetrics, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self.requests, self.prompt, self.cached = metrics.key_requests, metrics.key_prompt, metrics.key_cached
        self.completion, self.refused = metrics.key_completion, metrics.key_refused
        self._days: dict[tuple[str, str], Day] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._db: sqlite3.Connection | None = None
        self._day, self._date = -1, ""  # the UTC day (days since 1970) last seen, and its date

    def _today(self, name: str) -> Day:
        day = int(self._wall() // 86400)
        if day != self._day:
            self._day, self._date = day, time.strftime("%Y-%m-%d", time.gmtime(day * 86400))
        key = (name, self._date)
        self._dirty.add(key)
        row = self._days.get(key)
        if row is None:
            row = self._days[key] = Day()
        return row

    def admitted(self, name: str) -> None:
        self.requests.inc(name)
        self._today(name).requests += 1

    def used(self, name: str, prompt: int, cached: int, completion: int) -> None:
        day = self._today(name)
        if prompt:
            self.prompt.inc(name, amount=prompt)
            self.cached.inc(name, amount=cached)
            day.prompt_tokens += prompt
            day.cached_tokens += cached
        if completion:
            self.completion.inc(name, amount=completion)
            day.completion_tokens += completion

    def refusal(self, name: str, limit: str) -> None:
        self.refused.inc(name, limit)
        self._today(name).refused += 1

    def report(self, key: str | None = None) -> list[dict[str, int | str]]:
        """Every (key, day) row, oldest day first; ``key``: that key name's only."""
        return [{"key": name, "day": day, **asdict(d)} for (name, day), d in sorted(self._days.items(),
                                                                                   key=lambda kv: kv[0][::-1])
                if key is None or name == key]

    # -- persistence ---------------------------------------------------------------------------------------------
    def open(self, path: str) -> None:
        """Keep the table in the SQLite file ``path`` (created if missing); what it holds is added to the table."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = self._db = sqlite3.connect(path)
        with db:
                db.execute("CREATE TABLE IF NOT EXISTS usage (key TEXT, day TEXT, "
                       + ", ".join(f"{c} INTEGER" for c in COLUMNS) + ", PRIMARY KEY (key, day))")
        for name, day, *counts in db.execute("SELECT key, day, " + ", ".join(COLUMNS) + " FROM usage"):
            row = self._days.setdefault((name, day), Day())
            for column, n in zip(COLUMNS, counts, strict=True):
                setattr(row, column, getattr(row, column) + n)

    def flush(self) -> None:
        """Write the rows changed since the last flush (a failing disk is logged, the counts stay in memory)."""
        if self._db is None or not self._dirty:
            return
        rows = [(n, d, *asdict(self._days[(n, d)]).values()) for n, d in self._dirty]
        try:
            with self._db:
                self._db.executemany(f"INSERT OR REPLACE INTO usage VALUES (?, ?, {', '.join('?' * len(COLUMNS))})",
                                     rows)
        except sqlite3.Error as e:
            log.warning("cannot write usage to its SQLite file: %s (kept in memory, tried again later)", e)
            return
        self._dirty.clear()

    def close(self) -> None:
        self.flush()
        if self._db is not None:
            self._db.close()
            self._db = None
