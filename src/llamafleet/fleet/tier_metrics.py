"""The KV cache tiers' metrics (:mod:`llamafleet.engine.kv_tiers`), per replica, read from the engines' stats at
scrape time: hits, misses, restored tokens, bytes and entries per tier, save and restore time, evictions.

An engine counts from 0; a restarted replica (a new pid) adds to what its predecessors counted, so the counters
never go down. :func:`tier_json` is the same numbers for ``/v1/status``.
"""

from __future__ import annotations

from typing import Any

from llamafleet.engine.types import TierStats
from llamafleet.fleet.metrics import Counter, Gauge, Registry

TIERS = ("park", "ram", "disk")


class TierMetrics:
    """The ``llamafleet_kv_tier_*`` metrics."""

    def __init__(self, r: Registry) -> None:
        by = ("replica", "tier")
        self.hits = r.add(Counter("llamafleet_kv_tier_hits_total", "prompts that started from a state restored "
                                  "from a KV tier", by))
        self.misses = r.add(Counter("llamafleet_kv_tier_misses_total", "prompts that no slot served and that the "
                                    "tier did not either", by))
        self.tokens = r.add(Counter("llamafleet_kv_tier_restored_tokens_total", "prompt tokens restored from a KV "
                                    "tier instead of being computed", by))
        self.restore_s = r.add(Counter("llamafleet_kv_tier_restore_seconds_total", "time spent restoring states "
                                       "into slots (disk: reading and checking the file too)", by))
        self.evictions = r.add(Counter("llamafleet_kv_tier_evictions_total", "states that left a tier for room "
                                       "(park: to RAM; ram: to disk when it is on)", by))
        self.parks = r.add(Counter("llamafleet_kv_tier_parks_total", "slots' KV moved into a parked sequence of the "
                                   "context before their slot was reused", ("replica",)))
        self.saves = r.add(Counter("llamafleet_kv_tier_saves_total", "slot states copied to the RAM tier before "
                                   "their slot was reused", ("replica",)))
        self.save_s = r.add(Counter("llamafleet_kv_tier_save_seconds_total", "time spent copying those states",
                                    ("replica",)))
        self.declined = r.add(Counter("llamafleet_kv_tier_declined_total", "copies not made because prefilling "
                                      "the tokens again was measured to be faster (copy: save or restore)",
                                      ("replica", "copy")))
        self.deferred = r.add(Counter("llamafleet_kv_tier_deferred_steps_total", "steps whose KV tier copies took "
                                      "longer than a pass, so further prompts waited for the next step",
                                      ("replica",)))
        self.dropped = r.add(Counter("llamafleet_kv_tier_dropped_files_total", "damaged disk tier files deleted "
                                     "unread (truncated, failed checksum)", ("replica",)))
        self.bytes = r.add(Gauge("llamafleet_kv_tier_bytes", "bytes of states held in a KV tier", by))
        self.limit = r.add(Gauge("llamafleet_kv_tier_limit_bytes", "a KV tier's bound (0: off)", by))
        self.entries = r.add(Gauge("llamafleet_kv_tier_entries", "states held in a KV tier (park: sessions)", by))
        self.park_limit = r.add(Gauge("llamafleet_kv_tier_park_sequences", "parked sequences the context holds",
                                      ("replica",)))
        self._seen: dict[tuple[str, str], tuple[int | None, float]] = {}  # (metric, labels) -> (pid, last total)

    def _add(self, c: Counter, pid: int | None, total: float, *labels: str) -> None:
        key = (c.name, "/".join(labels))
        was_pid, seen = self._seen.get(key, (pid, 0.0))
        seen = seen if was_pid == pid else 0.0
        if total > seen:
            c.inc(*labels, amount=total - seen)
        self._seen[key] = (pid, max(seen, total))

    def refresh(self, rep: str, pid: int | None, t: TierStats | None) -> None:
        if t is None:
            return
        for tier in TIERS:
            self._add(self.hits, pid, t.hits[tier], rep, tier)
            self._add(self.misses, pid, t.misses[tier], rep, tier)
            self._add(self.tokens, pid, t.tokens[tier], rep, tier)
            self._add(self.restore_s, pid, t.restore_seconds[tier], rep, tier)
            self._add(self.evictions, pid, t.evictions[tier], rep, tier)
        self._add(self.saves, pid, t.saves, rep)
        self._add(self.parks, pid, t.parks, rep)
        self._add(self.save_s, pid, t.save_seconds, rep)
        self._add(self.dropped, pid, t.dropped_files, rep)
        for copy, n in t.declined.items():
            self._add(self.declined, pid, n, rep, copy)
        self._add(self.deferred, pid, t.deferrals, rep)
        for tier, held, limit, n in (("ram", t.ram_bytes, t.ram_limit_bytes, t.ram_entries),
                                     ("disk", t.disk_bytes, t.disk_limit_bytes if t.disk_on else 0, t.disk_entries)):
            self.bytes.set(held, rep, tier)
            self.limit.set(limit, rep, tier)
            self.entries.set(n, rep, tier)
        self.entries.set(t.park_entries, rep, "park")
        self.park_limit.set(t.park_limit, rep)


def tier_json(t: TierStats | None) -> dict[str, Any] | None:
    """A replica's tiers for ``/v1/status`` (None: no tier is on)."""
    if t is None:
        return None
    return {
        "park": {"sequences": t.park_limit, "entries": t.park_entries, "parks": t.parks, "hits": t.hits["park"],
                 "misses": t.misses["park"], "tokens": t.tokens["park"], "restore_s": t.restore_seconds["park"],
                 "evictions": t.evictions["park"]},
        "ram": {"bytes": t.ram_bytes, "limit_bytes": t.ram_limit_bytes, "entries": t.ram_entries,
                "hits": t.hits["ram"], "misses": t.misses["ram"], "tokens": t.tokens["ram"],
                "restore_s": t.restore_seconds["ram"], "evictions": t.evictions["ram"]},
        "disk": {"on": t.disk_on, "bytes": t.disk_bytes, "limit_bytes": t.disk_limit_bytes,
                 "entries": t.disk_entries, "hits": t.hits["disk"], "misses": t.misses["disk"],
                 "tokens": t.tokens["disk"], "restore_s": t.restore_seconds["disk"],
                 "evictions": t.evictions["disk"], "dropped_files": t.dropped_files},
        "saves": t.saves, "save_s": t.save_seconds, "failed_restores": t.failed_restores,
        "declined": dict(t.declined), "deferred_steps": t.deferrals,
        "us_per_token": {k: None if v is None else round(v * 1e6, 3) for k, v in t.rates.items()},
    }
