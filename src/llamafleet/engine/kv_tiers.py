"""KV cache tiers beyond the slots: a sequence's KV, saved before its slot is given to another prompt, and restored
when a later prompt starts with what it holds.

A slot's KV stays there after its sequence ends (:mod:`llamafleet.engine.prefix`), but only until the slot is taken:
with more sessions than slots (agents, long private documents) every session's next turn would prefill it all again.
With a **park tier** (:mod:`llamafleet.engine.kv_park`) the slot's KV is first moved into a spare sequence of the
same context, at no host cost, and restored from there; what leaves the park for room, or all of it without one,
goes on as follows. Before a slot's KV is overwritten, :meth:`KvTiers.save` copies that sequence's state out of
llama.cpp (``llama_state_seq_get_data_ext``: its cells, a few hundred bytes per token per layer) into the **RAM
tier**, keyed by the tokens it holds. A new prompt is then placed on the longest prefix found among the live slots
*and* the tiers (:meth:`KvTiers.restore`): a state from a tier is written back into the slot
(``llama_state_seq_set_data_ext``), cut after the shared prefix, and only the rest is prefilled.

The RAM tier is bounded in bytes (``cache_ram_bytes``); a full one gives up the state whose session is expected back
last (:mod:`llamafleet.engine.kv_order`: sessions' return intervals, counted in this engine's slot turnovers and
carried from tier to tier with the session's KV). With a **disk tier**
(:mod:`llamafleet.engine.kv_disk`) what leaves RAM is written to a file instead of being lost, and at shutdown
(:meth:`KvTiers.flush`, within a time bound) the slots' and the RAM tier's states are written too, so the next start
is warm. A state that is a prefix of a newer one is dropped (the newer one serves it); one already covered by a kept
state is not saved again. A state stays in its tier when restored (the slot's copy may be overwritten again soon).

Pure host-side bookkeeping around two :class:`~llamafleet.engine.llama.Context` calls; no threads: a save or restore
runs inside the engine's step, between passes (llama.cpp is idle then; its contexts are not safe to use from two
threads). Since every running sequence waits for them, copies are made only where they pay and spread over steps
(:mod:`llamafleet.engine.kv_cost`): a state is saved only if saving and restoring it cost less than prefilling it
again, restored only if that costs less than prefilling what it adds, both by rates measured on this engine; and once
a step's copies took longer than a pass, further prompts wait for the next step.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from llamafleet.engine.kv_buffers import Buffers, buffer_size, capacity
from llamafleet.engine.kv_cost import MIN_PASS_TOKENS, CopyCosts, StepBudget
from llamafleet.engine.kv_disk import DiskTier, entry_name, fingerprint
from llamafleet.engine.kv_order import Clock, ReturnOrder
from llamafleet.engine.kv_park import ParkTier
from llamafleet.engine.prefix import Placement, common_prefix
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import CacheOrigin, EngineConfig, TierStats

if TYPE_CHECKING:  # only a type: this module's unit tests load no llama.cpp
    from llamafleet.engine.llama import Context

log = logging.getLogger(__name__)

FLUSH_S = 5.0  # most seconds a shutdown spends writing states to disk (the worker is killed after 10)


@dataclass
class _State:
    tokens: list[int]
    state: memoryview  # of a recycled buffer (engine/kv_buffers.py)


@dataclass(frozen=True)
class Restored:
    """What a prompt got from the tiers: ``tokens`` of KV (0: none) from ``tier`` ("park", "ram" or "disk"), and the
    longest prefix any tier held (``candidate``; what a miss was closest to)."""

    tokens: int = 0
    tier: str = ""
    candidate: int = 0


class KvTiers:
    """The RAM tier of one engine, behind an optional park tier and in front of an optional disk tier."""

    def __init__(self, ram_bytes: int, disk: DiskTier | None, min_reuse: int, budget_s: float | None = None,
                 park: ParkTier | None = None, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()  # the park tier's too
        self._order: ReturnOrder[str] = ReturnOrder(self.clock)  # the RAM tier's states
        self._returned: dict[int, int] = {}  # slot -> return interval of the session restored into it
        self._came_from: dict[int, tuple[str, int]] = {}  # slot -> the RAM state restored into it, and its tokens used
        self.ram_limit = ram_bytes
        self.disk = disk
        self.park = park
        self.min_reuse = min_reuse
        self._ram: OrderedDict[str, _State] = OrderedDict()  # least recently used first
        self.buffers = Buffers()  # the states' buffers, recycled (counted in ram_bytes while kept there)
        self._states_bytes = 0  # the buffers of the states in self._ram
        self.hits = {"park": 0, "ram": 0, "disk": 0}
        self.misses = {"park": 0, "ram": 0, "disk": 0}
        self.tokens = {"park": 0, "ram": 0, "disk": 0}  # prompt tokens restored from each tier
        self.restore_s = {"park": 0.0, "ram": 0.0, "disk": 0.0}
        self.evictions = {"ram": 0}
        self.saves = 0
        self.save_s = 0.0
        self.failed = 0  # restores llama.cpp refused (the state did not fit this context)
        self.costs = CopyCosts()
        self.budget = StepBudget(budget_s)
        self.declined = {"save": 0, "restore": 0}  # copies the cost rules found slower than prefilling

    @classmethod
    def of(cls, cfg: EngineConfig, min_reuse: int, state_format: str) -> KvTiers:
        """The tiers ``cfg`` asks for (both off: :attr:`enabled` is False, and only the diagnostics work)."""
        disk = None
        if cfg.cache_dir and cfg.prefix_cache:
            shape = f"kv {cfg.kv_cache_type}, streams {1 if cfg.kv_unified else cfg.n_seq}, flash {cfg.flash_attn}"
            fp = fingerprint(cfg.model_path, shape, state_format)
            disk = DiskTier(cfg.cache_dir, cfg.model_path, fp, state_format, cfg.cache_disk_bytes)
        clock = Clock()
        park = ParkTier(cfg.n_seq, cfg.n_park, min_reuse, clock) if cfg.n_park and cfg.prefix_cache else None
        return cls(cfg.cache_ram_bytes if cfg.prefix_cache else 0, disk, min_reuse, cfg.copy_budget_s, park, clock)

    @property
    def enabled(self) -> bool:
        return self.ram_limit > 0 or self.disk is not None or self.park is not None

    def passed(self, seconds: float, prompt_tokens: int, tokens: int) -> None:
        """The engine ran a pass of ``tokens`` tokens, ``prompt_tokens`` of them a prompt's, in ``seconds``: the
        prefill rate (a pass mostly of prompt), and the copy budget of a step."""
        if prompt_tokens >= MIN_PASS_TOKENS and 2 * prompt_tokens >= tokens:
            self.costs.prefill.add(seconds, tokens)
        self.budget.last_pass_s = seconds

    def admit(self, ctx: Context, s: Sequence, place: Placement[Sequence]) -> int:
        """A new sequence ``s`` is placed by ``place``: save what its slot held, unless it is kept in place, and
        restore a tier's state into the slot if it beats what the slots offer. The tokens restored (0: none; the
        caller keeps that many of the slot's KV). Sets ``s.origin`` for the diagnostics either way."""
        lost, got = place.lost, Restored()
        kept = place.reuse if place.source is None and not place.wait else 0
        interval = self._returned.pop(s.slot, None)  # (of the session whose KV the slot holds)
        came_from = self._came_from.pop(s.slot, None)
        if self.enabled and lost is not None and lost.n_cached - kept >= self.min_reuse:
            self.clock.tick()
            tokens = lost.tokens[:lost.n_cached]
            keep, n = self.park.best(s.tokens, len(s.tokens) - 1) if self.park is not None else (None, 0)
            keep = keep if n >= place.reuse + self.min_reuse else None  # (what the restore below would take)
            freeing = keep is not None and self.park is not None and self.park.moves(keep, n)
            if self.park is None or not self.park.park(ctx, s.slot, tokens, self._saver(ctx), keep, freeing,
                                                       interval):
                self.save(ctx, s.slot, tokens, interval, came_from)
        if self.enabled and not place.wait and not s.req.params.prompt_logprobs and not s.lora:
            got = self.restore(ctx, s.slot, s.tokens, place.reuse)
        s.origin = CacheOrigin(**{got.tier: got.tokens} if got.tokens else {},
                               differs_at=max(place.best, got.candidate, place.reuse))
        return got.tokens

    # -- save ----------------------------------------------------------------------------------------------------
    def save(self, ctx: Context, slot: int, tokens: list[int], interval: int | None = None,
             came_from: tuple[str, int] | None = None) -> None:
        """Keep what ``slot`` holds (``tokens``) before the slot is overwritten, unless a tier already has it;
        ``interval``: its session's return interval, if learned; ``came_from``: the RAM state the slot's sequence
        was restored from and how many of its tokens it used. That state is dropped if it used 7/8 of it or more and
        this one holds those tokens: the session went on from it, and what it held beyond them was its last answer
        as generated, which the session sent back re-tokenized (its buffer then takes this state: kv_buffers.py)."""
        if len(tokens) < self.min_reuse or self._covered(tokens):
            return
        if not self.costs.worth_saving():
            self.declined["save"] += 1
            return
        t0 = time.perf_counter()
        tokens = list(tokens)
        interval = self._drop_replaced(tokens, came_from) or interval
        size = ctx.sequence_state_size(slot)
        if buffer_size(size) <= self.ram_limit:
            self._make_room(self.buffers.new_bytes(size))  # before the copy: the tier never holds more than its bound
        elif self.disk is None or not self.disk.on:
            return  # larger than the whole RAM tier, and no disk to take it
        into = self.buffers.take(size)
        state = ctx.save_sequence(slot, into)
        dt = time.perf_counter() - t0
        self.save_s += dt
        self.budget.add(dt)
        if state is not into:
            self._give(into)
        if state is None:
            return
        self.saves += 1
        self.costs.save.add(dt, len(tokens))
        if self.ram_bytes + capacity(state) > self.ram_limit:  # straight to disk
            self._spill(tokens, state)
            self._give(state)
            return
        key = entry_name(tokens)
        self._ram[key] = _State(tokens, state)
        self._order.add(key, interval)
        self._states_bytes += capacity(state)

    def _give(self, view: memoryview) -> None:
        """``view``'s buffer is free: kept for the next save if the tier's bound has room for it, else freed."""
        if self.ram_bytes + capacity(view) <= self.ram_limit:
            self.buffers.give(view)
        else:
            view.release()

    @property
    def ram_bytes(self) -> int:
        """Host memory the RAM tier holds: its states' buffers and those kept for the next saves."""
        return self._states_bytes + self.buffers.bytes

    def _forget(self, key: str) -> _State:
        """Take state ``key`` out of the RAM tier (its buffer is the caller's to give back)."""
        e = self._ram.pop(key)
        self._order.drop(key)
        self._states_bytes -= capacity(e.state)
        return e

    def held(self) -> tuple[list[tuple[int, list[int]]], list[str], list[str]]:
        """What the tiers hold: parked sequences and their tokens, the RAM tier's and the disk tier's state names."""
        return (self.park.parked() if self.park is not None else [], list(self._ram),
                self.disk.names() if self.disk is not None and self.disk.on else [])

    def _covered(self, tokens: list[int]) -> bool:
        n = len(tokens)
        if any(len(e.tokens) >= n and e.tokens[:n] == tokens for e in self._ram.values()):
            return True
        return self.disk is not None and self.disk.on and self.disk.covers(tokens)

    def _drop_replaced(self, tokens: list[int], came_from: tuple[str, int] | None) -> int | None:
        """The states that ``tokens``' state replaces, out of the RAM tier: those it extends (it serves them), and
        the one its sequence went on from (``came_from``, see :meth:`save`; one used only in part, e.g. for a shared
        prefix, stays). Their session's return interval, if one was learned."""
        def replaced(key: str, e: _State) -> bool:
            if len(e.tokens) < len(tokens) and tokens[:len(e.tokens)] == e.tokens:
                return True
            if came_from is None or came_from[0] != key:
                return False
            used = came_from[1]
            return 8 * used >= 7 * len(e.tokens) and common_prefix(tokens, e.tokens, used) >= used

        interval = None
        for key in [k for k, e in self._ram.items() if replaced(k, e)]:
            interval = interval or self._order.interval(key)
            self._give(self._forget(key).state)
        return interval

    def _make_room(self, size: int) -> None:
        """Free the kept buffers, then evict the states expected back last (to disk, when on), until ``size`` more
        bytes fit the bound."""
        if size and self.ram_bytes + size > self.ram_limit:
            self.buffers.clear()
        while self._ram and self.ram_bytes + size > self.ram_limit:
            key = self._order.victim(self._ram)
            assert key is not None
            old = self._forget(key)
            self.evictions["ram"] += 1
            self._spill(old.tokens, old.state)
            old.state.release()

    def _spill(self, tokens: list[int], state: memoryview) -> None:
        if self.disk is not None:
            self.disk.put(tokens, state)

    # -- restore -------------------------------------------------------------------------------------------------
    def restore(self, ctx: Context, slot: int, prompt: list[int], have: int) -> Restored:
        """Write into ``slot`` the tier state holding the longest prefix of ``prompt`` if it holds
        :attr:`min_reuse` tokens more than the ``have`` the slots offer (the prompt's last token never counts: it
        is decoded for the first answer's logits). The slot's KV then holds the state's tokens; the caller keeps
        the returned ``tokens`` of them. A prompt the slots served is no miss of the tiers."""
        cap = len(prompt) - 1
        parked, n_park = self.park.best(prompt, cap) if self.park is not None else (None, 0)
        key, n_ram = None, 0
        for k, e in self._ram.items():
            n = common_prefix(prompt, e.tokens, cap)
            if n > n_ram:
                key, n_ram = k, n
        name, n_disk = self.disk.best(prompt, cap) if self.disk is not None and self.disk.on else (None, 0)
        best = max(n_park, n_ram, n_disk)
        if best < have + self.min_reuse:
            if have < self.min_reuse:
                for tier, on in (("park", self.park), ("ram", True), ("disk", self.disk)):
                    self.misses[tier] += on is not None
            return Restored(candidate=best)
        if self.park is not None and parked is not None and n_park >= max(n_ram, n_disk):  # no host copy: always
            t0 = time.perf_counter()
            self._returned[slot] = self.park.restore(ctx, parked, slot, n_park)
            return self._hit("park", n_park, best, time.perf_counter() - t0)
        if key is not None and n_ram >= n_disk:
            tier, n, held = "ram", n_ram, len(self._ram[key].tokens)
        else:
            assert self.disk is not None and name is not None
            tier, n, held = "disk", n_disk, self.disk.held(name)
        if not self.costs.worth_restoring(tier, held, n - have):  # prefilling what it adds is cheaper
            self.declined["restore"] += 1
            return Restored(candidate=best)
        t0 = time.perf_counter()
        interval = None
        if key is not None and tier == "ram":
            self._ram.move_to_end(key)
            interval = self._order.hit(key)
            state: bytearray | memoryview | None = self._ram[key].state
        else:
            assert self.disk is not None and name is not None
            self.misses["ram"] += 1
            state = self.disk.load(name)
        into = slot
        if slot in ctx.copy_sources:  # a copy out of this slot (its old KV, parked) is still queued: the state goes
            # into a parked sequence first, and from there into the slot after that copy
            via = self.park.take(ctx, prompt[:n], self._saver(ctx), interval) if self.park is not None else None
            if via is None:
                return Restored(candidate=best)
            into = via
        ok = state is not None and ctx.restore_sequence(into, state)
        if self.park is not None and into != slot:
            if ok:
                self.park.restore(ctx, into, slot, n)
            else:
                self.park.forget(into)
        dt = time.perf_counter() - t0
        self.budget.add(dt)
        if not ok:
            self.restore_s[tier] += dt
            self.failed += 1
            self.misses[tier] += 1
            return Restored(candidate=best)
        self.costs.restore[tier].add(dt, held)
        if interval is not None:
            self._returned[slot] = interval
        if key is not None and tier == "ram" and into == slot:
            self._came_from[slot] = (key, n)
        return self._hit(tier, n, best, dt)

    def _hit(self, tier: str, n: int, best: int, seconds: float) -> Restored:
        self.hits[tier] += 1
        self.tokens[tier] += n
        self.restore_s[tier] += seconds
        return Restored(n, tier, best)

    def _saver(self, ctx: Context) -> Callable[[int, list[int], int | None], None]:
        """Where a parked sequence goes when it leaves the park for room: the RAM tier, by the copy rules."""
        return lambda seq, tokens, interval: self.save(ctx, seq, tokens, interval)

    # -- shutdown ------------------------------------------------------------------------------------------------
    def flush(self, ctx: Context, held: list[tuple[int, list[int]]], budget_s: float = FLUSH_S) -> int:
        """Write the slots' states (``held``: slot, tokens it holds), the parked ones and then the RAM tier's, most
        recently used first, to the disk tier, for at most ``budget_s`` seconds; the number written."""
        if self.disk is None or not self.disk.on:
            return 0
        deadline = time.monotonic() + budget_s
        written = 0
        for slot, tokens in held + (self.park.held() if self.park is not None else []):
            if time.monotonic() >= deadline:
                break
            if len(tokens) >= self.min_reuse and not self.disk.covers(tokens):
                state = ctx.save_sequence(slot)
                written += state is not None and self.disk.put(tokens, state)
        for e in reversed(list(self._ram.values())):
            if time.monotonic() >= deadline:
                break
            written += self.disk.put(e.tokens, e.state)
        log.info("KV tiers: %d states written to disk at shutdown", written)
        return written

    def stats(self) -> TierStats:
        d, c, p = self.disk, self.costs, self.park
        return TierStats(
            ram_bytes=self.ram_bytes, ram_limit_bytes=self.ram_limit, ram_entries=len(self._ram),
            disk_on=d is not None and d.on, disk_bytes=d.bytes if d else 0, disk_limit_bytes=d.limit_bytes if d else 0,
            disk_entries=d.entries if d else 0, hits=dict(self.hits), misses=dict(self.misses),
            tokens=dict(self.tokens), restore_seconds=dict(self.restore_s), saves=self.saves,
            save_seconds=self.save_s, evictions={"park": p.evictions if p else 0, "ram": self.evictions["ram"],
                                                  "disk": d.evictions if d else 0},
            dropped_files=d.dropped if d else 0, failed_restores=self.failed, declined=dict(self.declined),
            park_entries=p.entries if p else 0, park_limit=p.limit if p else 0, parks=p.parks if p else 0,
            deferrals=self.budget.deferrals, rates={
                "prefill": c.prefill.per_token, "save": c.save.per_token,
                "restore_ram": c.restore["ram"].per_token, "restore_disk": c.restore["disk"].per_token})


def first_origin(s: Sequence) -> CacheOrigin | None:
    """Where ``s``'s prompt KV came from, for its first output (None after that): the slot's share is what it
    reused beyond the tiers; a prompt served up to its last token has no ``differs_at``."""
    o, s.origin = s.origin, None
    if o is None:
        return None
    o = replace(o, slot=s.n_reused - o.park - o.ram - o.disk,
                differs_at=None if s.n_reused >= s.n_prompt - 1 else o.differs_at)
    log.debug("request %s: %d prompt tokens, %d from a slot, %d parked, %d from RAM, %d from disk; %s", s.request_id,
              s.n_prompt, o.slot, o.park, o.ram, o.disk, "served up to its last token" if o.differs_at is None else
              f"first differs from the best cached prefix at token {o.differs_at}")
    return o
