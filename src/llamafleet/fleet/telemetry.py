"""The fleet's metrics: what they are, and how HTTP traffic is counted.

Only the API process exports metrics. Workers report their engine's stats inside every
:class:`~llamafleet.fleet.messages.StepOutputs` (kept on each :class:`~llamafleet.fleet.replicas.ReplicaState`); the
dispatcher times every sequence (time to first token, time between tokens) and counts tokens and outcomes; the
:class:`~llamafleet.api.middleware.HttpMetrics` middleware counts every HTTP answer, including those refused before
routing (401, 413); the watchdog records GPU memory. :func:`~llamafleet.fleet.snapshot.publish` copies the state-like
values of a fleet snapshot into gauges just before ``GET /metrics`` renders them.
"""

from __future__ import annotations

from collections import Counter as CounterOf
from dataclasses import dataclass
from typing import Literal, get_args

from llamafleet.fleet.metrics import Counter, Gauge, Histogram, Registry
from llamafleet.fleet.router import Router
from llamafleet.fleet.tier_metrics import TierMetrics

TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LOAD_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
ModelState = Literal["unloaded", "loading", "loaded", "unloading", "failed"]  # of one model of several
MODEL_STATES: tuple[ModelState, ...] = get_args(ModelState)


@dataclass(frozen=True)
class GpuSample:
    """One GPU's memory and utilization at one moment (from NVML)."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int
    utilization_pct: float | None

    @property
    def used_fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


class FleetMetrics:
    """Every metric the API process exports (names start with ``llamafleet_``)."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.http_requests = r.add(Counter("llamafleet_http_requests_total", "HTTP requests answered",
                                           ("route", "method", "status")))
        self.http_seconds = r.add(Histogram("llamafleet_http_request_duration_seconds",
                                            "HTTP request start to last byte of the answer (end-to-end latency)",
                                            ("route",)))
        self.ttft = r.add(Histogram("llamafleet_time_to_first_token_seconds",
                                    "sequence submitted to its first generated token", ("replica",)))
        self.token_gap = r.add(Histogram("llamafleet_inter_token_seconds", "time between a sequence's tokens",
                                         ("replica",), buckets=TOKEN_GAP_BUCKETS))
        self.prompt_tokens = r.add(Counter("llamafleet_prompt_tokens_total", "prompt tokens of finished sequences"))
        self.prompt_cached = r.add(Counter("llamafleet_prompt_tokens_cached_total",
                                           "prompt tokens of finished sequences served from the prefix cache"))
        self.prompt_computed = r.add(Counter("llamafleet_prompt_tokens_computed_total",
                                             "prompt tokens of finished sequences not served from the prefix cache"))
        self.generated_tokens = r.add(Counter("llamafleet_generated_tokens_total",
                                              "tokens generated for finished sequences"))
        self.draft_tokens = r.add(Counter("llamafleet_draft_tokens_total", "speculative decoding: tokens drafted and "
                                          "verified for finished sequences"))
        self.draft_accepted = r.add(Counter("llamafleet_draft_accepted_tokens_total",
                                            "of those, tokens the model kept (each one also a generated token)"))
        self.draft_rejected = r.add(Counter("llamafleet_draft_rejected_tokens_total",
                                            "of those, tokens the model rejected (their KV given back)"))
        self.sequences = r.add(Counter("llamafleet_sequences_total", "sequences that ended, by how they ended",
                                       ("outcome",)))
        self.embedded_inputs = r.add(Counter("llamafleet_embedding_inputs_total",
                                             "inputs embedded (/v1/embeddings), in requests that succeeded"))
        self.embedded_tokens = r.add(Counter("llamafleet_embedding_tokens_total", "tokens of those inputs"))
        self.ranked_pairs = r.add(Counter("llamafleet_rerank_pairs_total",
                                          "query-document pairs scored (/v1/rerank), in requests that succeeded"))
        self.ranked_tokens = r.add(Counter("llamafleet_rerank_tokens_total", "tokens of those pairs"))
        self.refused = r.add(Counter("llamafleet_requests_refused_total",
                                     "requests refused before queueing, by reason", ("reason",)))
        self.routing = r.add(Counter("llamafleet_routing_decisions_total",
                                     "sequences routed, by why their replica was chosen", ("reason",)))
        self.queue_depth = r.add(Gauge("llamafleet_queue_depth", "sequences waiting for a slot, all replicas"))
        self.outstanding = r.add(Gauge("llamafleet_replica_outstanding",
                                       "sequences in flight on a replica (running or waiting)", ("replica",)))
        self.replica_up = r.add(Gauge("llamafleet_replica_up", "1 when the replica is ready to serve",
                                      ("replica", "where")))
        self.restarts = r.add(Counter("llamafleet_replica_restarts_total", "times a replica was restarted",
                                      ("replica",)))
        self.hangs = r.add(Counter("llamafleet_replica_hangs_total",
                                   "replicas killed as hung (silent past heartbeat_timeout_s)", ("replica",)))
        self.suspicions = r.add(Counter("llamafleet_replica_suspect_total", "times a replica became suspect (silent "
                                        "past its bound: no new work, its queued sequences moved)", ("replica",)))
        self.moved = r.add(Counter("llamafleet_sequences_moved_total",
                                   "sequences moved off a suspect replica before they started"))
        self.kv_tiers = TierMetrics(r)  # the KV cache tiers beyond the slots (fleet/tier_metrics.py)
        self.slots_total = r.add(Gauge("llamafleet_replica_slots", "sequence slots of a replica", ("replica",)))
        self.slots_busy = r.add(Gauge("llamafleet_replica_slots_busy", "slots running a sequence", ("replica",)))
        self.engine_waiting = r.add(Gauge("llamafleet_replica_waiting",
                                          "sequences inside the engine waiting for a slot", ("replica",)))
        self.kv_used = r.add(Gauge("llamafleet_kv_cache_tokens_used", "KV cache cells in use", ("replica",)))
        self.kv_total = r.add(Gauge("llamafleet_kv_cache_tokens", "KV cache cells", ("replica",)))
        self.steps = r.add(Counter("llamafleet_engine_steps_total",
                                           "engine steps (one llama_decode each, or one per LoRA adapter set)",
                                   ("replica",)))
        self.gpu_used = r.add(Gauge("llamafleet_gpu_memory_used_bytes", "GPU memory in use", ("gpu", "name")))
        self.gpu_total = r.add(Gauge("llamafleet_gpu_memory_total_bytes", "GPU memory", ("gpu", "name")))
        self.gpu_util = r.add(Gauge("llamafleet_gpu_utilization_ratio", "GPU busy fraction over NVML's last sample",
                                    ("gpu", "name")))
        self.overloaded = r.add(Gauge("llamafleet_overloaded",
                                      "1 while new work is refused because GPU memory is above the refuse watermark"))
        self.vram_warnings = r.add(Counter("llamafleet_gpu_memory_warnings_total",
                                           "watchdog scans that found a GPU above the warning watermark", ("gpu",)))
        self.recoveries = r.add(Counter("llamafleet_watchdog_recoveries_total",
                                        "replicas restarted by the watchdog, by reason", ("replica", "reason")))
        # Per model (several models behind one server; the series above count all of them together).
        self.model_requests = r.add(Counter("llamafleet_model_requests_total", "requests sent to a model's replicas",
                                            ("model",)))
        self.model_prompt_tokens = r.add(Counter("llamafleet_model_prompt_tokens_total",
                                                 "prompt tokens of a model's finished sequences", ("model",)))
        self.model_generated_tokens = r.add(Counter("llamafleet_model_generated_tokens_total",
                                                    "tokens generated for a model's finished sequences", ("model",)))
        self.model_ttft = r.add(Histogram("llamafleet_model_time_to_first_token_seconds",
                                          "sequence submitted to its first token, per model", ("model",)))
        self.model_queue_depth = r.add(Gauge("llamafleet_model_queue_depth",
                                             "sequences waiting for a slot of a model's replicas", ("model",)))
        self.model_load_waiting = r.add(Gauge("llamafleet_model_load_waiting",
                                              "requests waiting for a model to load", ("model",)))
        self.model_state = r.add(Gauge("llamafleet_model_state", "1 for a model's current state",
                                       ("model", "state")))
        self.model_loads = r.add(Counter("llamafleet_model_loads_total", "model loads, by outcome (loaded, failed)",
                                         ("model", "outcome")))
        self.model_load_seconds = r.add(Histogram("llamafleet_model_load_seconds", "time to load a model, "
                                                  "placement and evictions included", ("model",),
                                                  buckets=LOAD_BUCKETS))
        self.model_evictions = r.add(Counter("llamafleet_model_evictions_total", "model unloads, by reason (lru: "
                                             "room for another, idle: idle_ttl_s, admin)", ("model", "reason")))
        # Per API key, by its name (never the key itself: llamafleet.tenants)
        self.key_requests = r.add(Counter("llamafleet_key_requests_total", "requests admitted, by key name", ("key",)))
        self.key_prompt = r.add(Counter("llamafleet_key_prompt_tokens_total", "prompt tokens, by key name", ("key",)))
        self.key_cached = r.add(Counter("llamafleet_key_cached_tokens_total",
                                        "of those, served from the prefix cache, by key name", ("key",)))
        self.key_completion = r.add(Counter("llamafleet_key_completion_tokens_total", "generated tokens, by key name",
                                            ("key",)))
        self.key_refused = r.add(Counter("llamafleet_key_refused_total", "requests refused, by key name and the limit "
                                         "or check that refused them (a limit's name, scope, model)", ("key", "limit")))
        self._steps_seen: dict[str, tuple[int | None, int]] = {}  # replica -> (worker pid, its steps counted)
        self._retired: CounterOf[str] = CounterOf()  # routing decisions of replica sets since unloaded

    def retire(self, router: Router) -> None:
        """A model's replicas are gone: keep its routing decisions in the totals."""
        self._retired.update(router.decisions)

    @property
    def retired(self) -> CounterOf[str]:
        """The routing decisions of replica sets since unloaded."""
        return CounterOf(self._retired)

    def count_steps(self, replica: str, pid: int | None, steps: int) -> None:
        """``replica``'s worker ``pid`` reports ``steps`` so far: a worker counts its steps from 0, so a restarted
        one (a new pid) adds to what the old ones counted."""
        seen_pid, seen = self._steps_seen.get(replica, (pid, 0))
        seen = seen if seen_pid == pid else 0
        if steps > seen:
            self.steps.inc(replica, amount=steps - seen)
        self._steps_seen[replica] = (pid, max(seen, steps))
