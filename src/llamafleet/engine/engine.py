"""The engine: continuous batching of many requests over one llama.cpp context.

``step()`` is the whole loop body: collect the pass the previous step launched (wait for it, sample every sequence
that produced logits, count the new tokens), admit waiting requests into free slots (:mod:`llamafleet.engine.admission`,
each starting from the KV already computed for the longest prefix of its prompt), schedule tokens under the
``n_batch`` budget (running answers first, prompt chunks after), launch the next ``llama_decode``, and only then
detokenize and check stop strings for the tokens just sampled. On a GPU the decode runs while Python does that text
work and while the caller ships the step's outputs, so the host's per-token work stays off the critical path. A
sequence that hits a stop string may already have a token in the running pass; that token is dropped and the slot
freed once the pass is collected. No asyncio, threads or I/O: callers drive it (the worker process, tests, the
consistency checker, benchmarks). Embedding requests (:meth:`Engine.add_embedding`) run beside, in a second context,
one pass per step: :mod:`llamafleet.engine.embedding`.

``add_request``, ``add_embedding`` and ``abort`` may be called from another thread; they only append to queues that
``step`` drains.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from llamafleet.engine.admission import Admission
from llamafleet.engine.batch_fill import fill
from llamafleet.engine.cores import default_threads
from llamafleet.engine.embedding import Embedder
from llamafleet.engine.held_keys import HeldChange, HeldKeys
from llamafleet.engine.kv_tiers import KvTiers, first_origin
from llamafleet.engine.llama import STATE_FORMAT, Batch, Context, Model
from llamafleet.engine.loop import EngineLoop
from llamafleet.engine.lora import Adapters
from llamafleet.engine.prefix import SlotIndex
from llamafleet.engine.sampling import Rows, sample, score_prompts
from llamafleet.engine.scheduler import Waiting, schedule
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.speculative.policy import PassCost
from llamafleet.engine.speculative.speculator import Speculator
from llamafleet.engine.types import (
    EmbeddingRequest,
    EngineConfig,
    EngineStats,
    FinishReason,
    Request,
    RequestOutput,
    TopLogprobs,
)

# a sampled token: (sequence, token or None, logprob, top alternatives, end, answer tokens counted with it)
Fresh = tuple[Sequence, int | None, float | None, TopLogprobs | None, FinishReason | None, int]

log = logging.getLogger(__name__)


class Engine(Admission, EngineLoop):
    """Loads a model and a context for ``cfg.n_seq`` parallel sequences; ``close()`` (or ``with``) frees both."""

    reports_held = True

    def __init__(self, cfg: EngineConfig, progress: Callable[[float], None] | None = None) -> None:
        self.cfg = cfg
        threads = cfg.n_threads or default_threads()
        self.model = Model(cfg, progress)
        ctx_cfg = EngineConfig(**{**cfg.__dict__, "n_threads": threads})
        self._parked = cfg.n_park + 1 if cfg.n_park and cfg.prefix_cache else 0  # sequences (engine/kv_park.py)
        try:
            self.ctx = Context(self.model, ctx_cfg, park=self._parked)
        except BaseException:
            self.model.close()
            raise
        self.batch = Batch(cfg.n_batch)
        self.embedder = Embedder(self.model, ctx_cfg)  # its own context, created on first use
        self._incoming: deque[Request] = deque()
        self._aborts: deque[str] = deque()
        self._waiting = Waiting(cfg.n_seq, priorities=cfg.priorities)
        self._running: list[Sequence] = []
        self._slots = SlotIndex[Sequence](cfg.n_seq, cfg.prefix_cache)  # free slots, and what every slot's KV holds
        self.tiers = KvTiers.of(cfg, self._slots.min_reuse, STATE_FORMAT)  # KV beyond the slots: RAM, disk
        self.held = HeldKeys()  # which of the router's prefix keys all that KV holds (engine/held_keys.py)
        self._steps = 0
        self._launch_s = 0.0  # how long the last llama_decode call took
        self._prompt_total = 0
        self._prompt_cached = 0
        self._gen_total = 0
        self._decode_s = 0.0
        self._sample_s = 0.0
        self._step_s = 0.0
        # the pass launched by the last step, not yet collected: its plan and the (sequence, batch index) to sample
        self._inflight: tuple[list[tuple[Sequence, int]], list[tuple[Sequence, int]]] | None = None
        # with prompts scored in that pass: its number of logits rows, the sampled entries' rows, and per scored
        # entry (sequence, first row, first position, positions)
        self._rows: Rows | None = None  # where the in-flight pass's logits rows are, when it scores prompts
        self._deferred: list[Sequence] = []  # ended while a pass ran: slots freed once it is collected
        self._passes = PassCost()  # what a pass costs by its tokens: whether prompts share one (engine/scheduler.py)
        try:  # (a draft model and LoRA adapters are loaded here, and may be refused)
            self.spec = Speculator.create(ctx_cfg, self.model)
            self.lora = Adapters(self.model, cfg.lora)
        except BaseException:
            self.close()
            raise

    # -- lifetime ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "tiers", None) is not None and self.tiers.enabled and self.ctx.ptr:  # slots' KV to disk
            self.tiers.flush(self.ctx, self._slots.contents())
        for s in self._running + self._deferred:
            if s.chain is not None:
                s.chain.close()
        self._running.clear()
        if getattr(self, "embedder", None) is not None:
            self.embedder.close()
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
        if (spec := getattr(self, "spec", None)) is not None:
            spec.close()
        if (lora := getattr(self, "lora", None)) is not None:
            lora.close()
        self.model.close()

    def add_request(self, req: Request) -> None:
        self.check_request(req)
        self.lora.check(req.params.lora)
        self._incoming.append(req)

    def add_embedding(self, req: EmbeddingRequest) -> None:
        """Queue an embedding request (checked now: ``ValueError``); see :mod:`llamafleet.engine.embedding`."""
        self.embedder.add(req)

    def add_rerank(self, request_id: str, query: str, documents: tuple[str, ...]) -> None:
        """Queue a reranker's scoring of ``query`` against each of ``documents`` (checked now: ``ValueError``)."""
        self.embedder.add(EmbeddingRequest(request_id, self.embedder.pairs(query, documents), rank=True))

    def abort(self, request_id: str) -> None:
        """Cancel a request; the next ``step()`` reports it finished with ``finish_reason="cancelled"``."""
        self._aborts.append(request_id)

    def has_work(self) -> bool:
        return bool(self._incoming or self._aborts or self._waiting or self._running or self._inflight
                    or self.embedder.has_work())

    def stats(self) -> EngineStats:
        return EngineStats(
            slots_total=self.cfg.n_seq,
            slots_busy=len(self._running),
            waiting=len(self._waiting) + len(self._incoming),
            kv_tokens_used=sum(s.n_cached for s in self._running),
            kv_tokens_total=self.ctx.n_ctx * self.cfg.n_seq // (self.cfg.n_seq + self._parked),  # (the slots')
            steps=self._steps,
            prompt_tokens_total=self._prompt_total,
            generated_tokens_total=self._gen_total,
            decode_seconds_total=self._decode_s,
            step_seconds_total=self._step_s,
            sample_seconds_total=self._sample_s,
            prompt_tokens_cached_total=self._prompt_cached,
            draft_tokens_total=self.spec.drafted_total if self.spec else 0,
            draft_accepted_total=self.spec.accepted_total if self.spec else 0,
            tiers=self.tiers.stats() if self.tiers.enabled else None,
        )

    def held_change(self) -> HeldChange | None:
        """The router's prefix keys that this engine's slots and tiers gained and lost since the last call."""
        return self.held.change(self._slots.holders(), *self.tiers.held())

    def disk_tier(self) -> str | None:
        """The disk tier's folder, while it is on."""
        d = self.tiers.disk
        return str(d.dir) if d is not None and d.on else None

    # -- the loop body ----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Finish the pass launched by the previous step (sample it), launch the next one, and only then turn the
        sampled tokens into text and outputs: on a GPU that host work overlaps the next pass."""
        t0 = time.perf_counter()
        outs: list[RequestOutput] = []
        while self._incoming:
            self._waiting.append(self._incoming.popleft())
        self._apply_aborts(outs)
        fresh = self._collect() if self._inflight is not None else []
        self.lora.reap(self.ctx, self._running, self._waiting)
        self._admit()
        ready = [s for s in self._running if s.wait_for is None]
        if self.spec is not None:
            self.spec.draft(ready, self.cfg.n_batch)
        plan = schedule(ready, self.cfg.n_batch, self._steps, self.cfg.prefill_tokens, self._join_tokens(),
                        self._waiting.shares())
        error = None
        if plan:
            for adapters, part in self.lora.groups(plan):  # one decode per LoRA adapter set (engine/lora.py)
                if self._inflight is not None:  # the step's previous part: sampled before the next decode
                    fresh += self._collect()
                self.lora.apply(self.ctx, adapters)
                if (error := self._launch(part)) is not None:
                    plan = part
                    break
            self._steps += 1
            if not self.cfg.overlap and self._inflight is not None:
                fresh += self._collect()
        outs += [self._emit(*item) for item in fresh if not item[0].closed]
        if self.embedder.has_work():  # one pass of inputs to embed, while the generation pass runs on a GPU
            outs += self.embedder.step(generating=bool(self._running))
        if error is not None:
            for s, _ in plan:
                s.n_cached = 0  # what its KV holds after a failed decode is unknown: reuse none of it
                if not s.done:  # (a stop string may just have ended it)
                    out = self._finish(s, "error")
                    out.error = error
                    outs.append(out)
        self._step_s += time.perf_counter() - t0
        return outs

    def _join_tokens(self) -> float | None:
        """The most tokens of a prompt that join a pass holding another prompt's: as many as the pass's fixed cost
        pays for (engine/scheduler.py); None (any) until passes of different sizes were measured."""
        fit = self._passes.fit()
        if fit is None or fit[1] <= 0:
            return None
        return max(0.0, fit[0] / fit[1])

    def _apply_aborts(self, outs: list[RequestOutput]) -> None:
        while self._aborts:
            rid = self._aborts.popleft()
            outs += self.embedder.abort(rid)
            self._cancel(rid, outs)

    def _launch(self, plan: list[tuple[Sequence, int]]) -> str | None:
        """Fill the batch from ``plan`` and start its ``llama_decode`` (see :meth:`Context.launch`); the error
        message if llama.cpp refused it."""
        b = self.batch
        sampled, self._rows = fill(b, plan)
        t0 = time.perf_counter()
        rc = self.ctx.launch(b)
        self._launch_s = time.perf_counter() - t0  # (on a CPU the whole pass; on a GPU, until it is queued)
        self._decode_s += self._launch_s
        if rc != 0:
            msg = f"llama_decode failed with status {rc} on a batch of {b.n_tokens} tokens"
            log.error(msg)
            return msg
        self._inflight = (plan, sampled)
        return None

    def _collect(self) -> list[Fresh]:
        """Wait for the launched pass, sample it, and append each new token to its sequence. Sequences that end
        here (EOS, length) leave at once; the text work for every token is left to :meth:`_emit`."""
        assert self._inflight is not None
        plan, sampled = self._inflight
        t0 = time.perf_counter()
        self.ctx.wait()
        self._inflight = None
        t1 = time.perf_counter()
        self._decode_s += t1 - t0
        if self.spec is not None:  # what the pass cost: whether drafts pay (engine/speculative/)
            self.spec.observe(plan, self._launch_s + t1 - t0)
        prompt, pass_s, n = 0, self._launch_s + t1 - t0, sum(k for _, k in plan)
        for s, k in plan:  # (a speculating sequence's drafts too: Speculator.settle gives back the rejected)
            if s.n_cached < s.n_prompt:
                prompt += min(k, s.n_prompt - s.n_cached)
            s.n_cached += k
        self._prompt_total += prompt
        self.tiers.passed(pass_s, prompt, n)
        self._passes.observe(n, pass_s)
        fresh: list[Fresh] = []
        n_rows, rows = None, None
        if self._rows is not None:
            n_rows, rows, scored = self._rows
            score_prompts(self.ctx.logits(n_rows), scored)
        sampled, rows, drafting = Speculator.split(sampled, rows)
        if sampled:
            tokens, logprobs, tops = sample(self.ctx, sampled, n_rows, rows)
            for i, (s, _) in enumerate(sampled):
                if not s.done:  # ended (stop string, cancel) while this pass ran: its token is dropped
                    fresh.append(self._accept(s, int(tokens[i]), None if logprobs is None else float(logprobs[i]),
                                              None if tops is None else tops[i]))
        if drafting:
            fresh += self._verify(drafting, n_rows)
        self._sample_s += time.perf_counter() - t1
        while self._deferred:  # slots and KV of sequences that ended while the pass ran
            self._release(self._deferred.pop())
        return fresh

    def _verify(self, drafting: list[tuple[Sequence, int]], n_rows: int | None) -> list[Fresh]:
        """Keep the tokens the target agrees with of each speculating sequence's drafts (one output each, in
        order, until one ends it), and give back the KV of the rest (see engine/speculative/)."""
        assert self.spec is not None and n_rows is not None
        logits = self.ctx.logits(n_rows)
        fresh: list[Fresh] = []
        for s, row in drafting:
            kept = self.spec.verify(self.ctx, s, logits, row)
            for tok, lp, top in kept or []:
                fresh.append(self._accept(s, tok, lp, top))
                if s.done:
                    break
            self.spec.settle(self.ctx, s, None if kept is None else len(kept))
        return fresh

    def _accept(self, s: Sequence, tok: int, logprob: float | None, top: TopLogprobs | None) -> Fresh:
        """Count the sampled token and decide the ends that need no text: EOS, max_tokens, the context limit."""
        p = s.req.params
        if p.max_tokens == 0:  # a prompt only scored: the token sampled after it is not part of the answer
            self._retire(s)
            return s, None, None, None, "length", 0
        self._gen_total += 1
        s.n_generated += 1
        end: FinishReason | None = None
        if self.model.eog[tok] and not p.ignore_eos:
            end = "stop"  # the EOS token is not part of the answer
        else:
            s.tokens.append(tok)
            if s.budget is not None:
                s.budget.saw(tok, self.model.pieces[tok])
            if len(s.tokens) >= self.cfg.n_ctx_per_seq or (p.max_tokens is not None and s.n_generated >= p.max_tokens):
                end = "length"
        if end is not None:
            self._retire(s)
        return s, tok, logprob, top, end, s.n_generated

    def _emit(self, s: Sequence, tok: int | None, logprob: float | None, top: TopLogprobs | None,
              end: FinishReason | None, n_generated: int) -> RequestOutput:
        """The output for one sampled token (None: none, a prompt only scored): its text (stop strings held back),
        the end if there is one, and, the first time, the prompt's scores if they were asked for. ``n_generated``:
        the answer's tokens up to this one (a step that kept drafts made more after it)."""
        lps = None if logprob is None else [logprob]
        text, hit = ("", False) if end == "stop" or tok is None else s.stops.feed(s.detok.feed(self.model.pieces[tok]))
        if hit:
            if not s.done:
                self._retire(s)
            end = "stop"
        elif end is not None:
            tail, _ = s.stops.feed(s.detok.flush())
            text += tail + s.stops.flush()
        if end is not None:
            s.closed, s.n_generated = True, n_generated  # a stop string's: tokens kept after it are not the answer's
        out = RequestOutput(s.request_id, text=text, token_ids=[] if tok is None else [tok], logprobs=lps,
                            finished=end is not None, finish_reason=end, prompt_tokens=s.n_prompt,
                            completion_tokens=n_generated, cached_tokens=s.n_reused,
                            top_logprobs=None if top is None else [top], prompt_logprobs=s.scores,
                            drafted_tokens=s.drafted, accepted_tokens=s.accepted,
                            cache=first_origin(s))
        s.scores = None
        return out

    def _finish(self, s: Sequence, reason: FinishReason) -> RequestOutput:
        """End ``s`` without a new token (cancelled, or a failed decode)."""
        self._retire(s)
        s.closed = True
        return RequestOutput(s.request_id, finished=True, finish_reason=reason, prompt_tokens=s.n_prompt,
                             completion_tokens=s.n_generated, cached_tokens=s.n_reused, drafted_tokens=s.drafted,
                             accepted_tokens=s.accepted)

    def _retire(self, s: Sequence) -> None:
        """Take ``s`` out of the batch. Its slot and KV are freed now, or, while a pass is running (it may hold one
        of ``s``'s tokens), right after that pass is collected."""
        s.done = True
        self._running.remove(s)
        if self._inflight is not None:
            self._deferred.append(s)
        else:
            self._release(s)

    def _release(self, s: Sequence) -> None:
        """Free ``s``'s slot; its KV stays there for a later prompt with the same prefix, until the slot is taken."""
        if self.ctx.backend_sampling and not s.in_graph:
            self.ctx.use_backend_greedy(s.slot, True)
        self._slots.release(s.slot)
        if self.spec is not None:
            self.spec.release(s)
        if s.chain is not None:
            s.chain.close()
            s.chain = None
