"""The KV tiers' metrics: read from an engine's TierStats, counters that keep counting over a replica restart, and
the /v1/status form."""

from __future__ import annotations

from dataclasses import replace

from llamafleet.engine.types import TierStats
from llamafleet.fleet.metrics import Registry
from llamafleet.fleet.tier_metrics import TierMetrics, tier_json

STATS = TierStats(ram_bytes=300, ram_limit_bytes=1000, ram_entries=2, disk_on=True, disk_bytes=5000,
                  disk_limit_bytes=9000, disk_entries=4, hits={"park": 7, "ram": 3, "disk": 1},
                  misses={"park": 3, "ram": 2, "disk": 1}, tokens={"park": 2100, "ram": 900, "disk": 400},
                  restore_seconds={"park": 0.001, "ram": 0.01, "disk": 0.05}, saves=6, save_seconds=0.02,
                  evictions={"park": 1, "ram": 2, "disk": 0}, dropped_files=1, failed_restores=0,
                  declined={"save": 5, "restore": 1}, deferrals=2,
                  rates={"prefill": 1e-4, "save": 3e-4, "restore_ram": 6e-5, "restore_disk": None},
                  park_entries=3, park_limit=4, parks=9)


def test_counters_follow_the_engine_and_survive_a_restart() -> None:
    r = Registry()
    m = TierMetrics(r)
    m.refresh("r0", 100, STATS)
    m.refresh("r0", 100, STATS)  # the same numbers again: nothing added
    assert m.hits.get("r0", "ram") == 3 and m.tokens.get("r0", "disk") == 400 and m.saves.get("r0") == 6
    restarted = replace(STATS, hits={"park": 0, "ram": 1, "disk": 0}, tokens={"park": 0, "ram": 50, "disk": 0},
                        saves=1, ram_bytes=10, parks=2)
    m.refresh("r0", 200, restarted)  # a new worker counts from 0: its counts add to the old ones
    assert m.hits.get("r0", "ram") == 4 and m.tokens.get("r0", "ram") == 950 and m.saves.get("r0") == 7
    assert m.bytes.get("r0", "ram") == 10 and m.limit.get("r0", "disk") == 9000
    m.refresh("r0", 200, replace(restarted, disk_on=False))
    assert m.limit.get("r0", "disk") == 0  # a disk tier turned off shows as off
    assert 'llamafleet_kv_tier_hits_total{replica="r0",tier="ram"} 4' in r.render()
    assert m.declined.get("r0", "save") == 10 and m.deferred.get("r0") == 4  # both workers' counts
    assert m.hits.get("r0", "park") == 7 and m.parks.get("r0") == 11 and m.entries.get("r0", "park") == 3


def test_status_form() -> None:
    assert tier_json(None) is None
    d = tier_json(STATS)
    assert d is not None and d["ram"]["hits"] == 3 and d["disk"]["on"] and d["disk"]["dropped_files"] == 1
    assert d["park"] == {"sequences": 4, "entries": 3, "parks": 9, "hits": 7, "misses": 3, "tokens": 2100,
                         "restore_s": 0.001, "evictions": 1}
    assert d["saves"] == 6 and d["declined"] == {"save": 5, "restore": 1} and d["deferred_steps"] == 2
    assert d["us_per_token"] == {"prefill": 100.0, "save": 300.0, "restore_ram": 60.0, "restore_disk": None}
