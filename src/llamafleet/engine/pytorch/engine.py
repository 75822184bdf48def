"""The torch engine: continuous batching over a Hugging Face LLaMA checkpoint, with the llama.cpp engine's interface.

The worker (:mod:`llamafleet.fleet.worker`) drives it exactly as it drives :class:`~llamafleet.engine.engine.Engine`:
``add_request`` / ``abort`` queue work, ``step()`` runs one pass of every running answer (and prompt chunks) and
returns each sequence's new text; tokenizing, chat templates and the request checks are the shared text side's
(:class:`~llamafleet.engine.textside.TextSide`) over the checkpoint's tokenizer (:mod:`.vocab`). Each step: admit
waiting requests into free slots, schedule tokens under ``n_batch`` (running answers first, then prompt chunks up to
``prefill_tokens``: :func:`~llamafleet.engine.scheduler.schedule`), run the answers' tokens as one batched pass and
the prompt chunks as another, padded to the longest (:mod:`.forward`), sample (:mod:`.sampling`), detokenize and
check stop strings. Requests join and leave between steps; a finished slot is reused at once.

What it does not implement is refused when the request arrives, each with a message naming the llama.cpp engine as
the way (docs/API.md, "The torch engine"): grammars and structured output, prompt logprobs, reasoning budgets,
fill-in-the-middle, embeddings. There is no prefix cache (every prompt is computed) and no speculative decoding.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import torch

from llamafleet.engine.infill import Infill
from llamafleet.engine.loop import EngineLoop
from llamafleet.engine.pytorch import graphs
from llamafleet.engine.pytorch.forward import Group, SlotModel
from llamafleet.engine.pytorch.sampling import Draw, sample
from llamafleet.engine.pytorch.vocab import GrammarUnsupported, HfVocab
from llamafleet.engine.scheduler import Waiting, schedule
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.textside import TextSide
from llamafleet.engine.types import (
    EmbeddingRequest,
    EngineConfig,
    EngineStats,
    FinishReason,
    Request,
    RequestOutput,
    TopLogprobs,
)

log = logging.getLogger(__name__)
ELSEWHERE = "; serve the model as a GGUF with the llama.cpp engine for it"


class TorchEngine(EngineLoop, TextSide[HfVocab]):
    """Loads the checkpoint folder ``cfg.model_path`` for ``cfg.n_seq`` parallel sequences; ``close()`` frees it."""

    def __init__(self, cfg: EngineConfig, progress: Callable[[float], None] | None = None) -> None:
        if not Path(cfg.model_path).is_dir():
            raise ValueError(f"{cfg.model_path} is not a folder; the torch engine loads a Hugging Face checkpoint "
                             "folder (config.json, *.safetensors, tokenizer.json)")
        if cfg.speculative.mode != "off":
            raise ValueError("speculative decoding runs in the llama.cpp engine only; set speculative.mode: off for "
                             "this model")
        self.cfg = cfg
        if cfg.n_threads:
            torch.set_num_threads(cfg.n_threads)
        self.model = HfVocab(cfg.model_path)
        self.net = SlotModel(cfg)
        self.graphs = graphs.for_model(self.net, cfg.cuda_graphs)
        if progress is not None:
            progress(1.0)
        self.eog = self.model.end_ids(self.net.config.eos_token_id)
        self._incoming: deque[Request] = deque()
        self._aborts: deque[str] = deque()
        # admission by priority and fair share, as llama.cpp's engine
        self._waiting = Waiting(cfg.n_seq, priorities=cfg.priorities)
        self._running: list[Sequence] = []
        self._draws: dict[str, Draw] = {}
        self._free = list(range(cfg.n_seq))
        self._steps = self._prompt_total = self._gen_total = 0
        self._decode_s = self._sample_s = self._step_s = 0.0

    # -- lifetime and the worker's calls ------------------------------------------------------------------------
    def close(self) -> None:
        self._running.clear()
        if (captured := getattr(self, "graphs", None)) is not None:
            captured.close()
        if getattr(self, "net", None) is not None:
            self.net.close()

    def add_request(self, req: Request) -> None:
        p = req.params
        unsupported = [(p.prompt_logprobs, "prompt_logprobs (scoring the prompt)"),
                       (p.think_budget is not None, "a reasoning budget (think_budget)")]
        for used, what in unsupported:
            if used:
                raise GrammarUnsupported(f"{what} is not implemented by the torch engine{ELSEWHERE}")
        self.check_request(req)
        self._incoming.append(req)

    def add_embedding(self, req: EmbeddingRequest) -> None:
        raise GrammarUnsupported(f"the torch engine serves text generation only, not embeddings{ELSEWHERE} (an "
                                 "embedding model)")

    def add_rerank(self, request_id: str, query: str, documents: tuple[str, ...]) -> None:
        raise GrammarUnsupported(f"the torch engine serves text generation only, not reranking{ELSEWHERE} (a "
                                 "reranker)")

    def tokenize_infill(self, req: Infill, max_tokens: int | None) -> list[int]:
        raise GrammarUnsupported(f"fill-in-the-middle (/infill) is not implemented by the torch engine{ELSEWHERE} "
                                 "(a code model with FIM tokens)")

    def abort(self, request_id: str) -> None:
        self._aborts.append(request_id)

    def has_work(self) -> bool:
        return bool(self._incoming or self._aborts or self._waiting or self._running)

    def stats(self) -> EngineStats:
        return EngineStats(
            slots_total=self.cfg.n_seq, slots_busy=len(self._running),
            waiting=len(self._waiting) + len(self._incoming),
            kv_tokens_used=sum(s.n_cached for s in self._running),
            kv_tokens_total=self.cfg.n_seq * self.cfg.n_ctx_per_seq, steps=self._steps,
            prompt_tokens_total=self._prompt_total, generated_tokens_total=self._gen_total,
            decode_seconds_total=self._decode_s, step_seconds_total=self._step_s,
            sample_seconds_total=self._sample_s, graph_steps_total=self.graphs.replays if self.graphs else 0,
        )

    def allocated_bytes(self) -> tuple[int, int]:
        """Bytes of the weights and of the KV cache as allocated (what the planner estimates)."""
        return self.net.allocated_bytes()

    # -- the loop body ----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        outs: list[RequestOutput] = []
        while self._incoming:
            self._waiting.append(self._incoming.popleft())
        self._apply_aborts(outs)
        self._admit()
        plan = schedule(self._running, self.cfg.n_batch, self._steps, self.cfg.prefill_tokens)
        if plan:
            self._steps += 1
            try:
                outs += self._run(plan)
            except Exception as e:  # a failed pass (out of memory, ...) ends its sequences, not the replica
                log.exception("a pass of %d sequences failed", len(plan))
                for s, _ in plan:
                    if not s.done:
                        out = self._finish(s, "error")
                        out.error = f"the torch engine's pass failed: {type(e).__name__}: {e}"
                        outs.append(out)
        self._step_s += time.perf_counter() - t0
        return outs

    def _apply_aborts(self, outs: list[RequestOutput]) -> None:
        while self._aborts:
            self._cancel(self._aborts.popleft(), outs)

    def _admit(self) -> None:
        while self._waiting and self._free:
            req = self._waiting.pop(self._running, len(self._free))
            if req is None:
                break  # the last slot is kept for better work (engine/scheduler.py)
            s = Sequence(req, self._free.pop(0), None)
            self._draws[req.request_id] = Draw(req.params, req.prompt_tokens, self.net.device)
            self._running.append(s)

    def _run(self, plan: list[tuple[Sequence, int]]) -> list[RequestOutput]:
        """One batched pass of the answers' next tokens and one of the prompt chunks (padded to the longest); then
        sample those that reached the end of what they have."""
        dev = self.net.device
        t0 = time.perf_counter()
        decoding = [s for s, k in plan if s.n_cached + k == len(s.tokens) and k == 1 and s.n_cached >= s.n_prompt]
        ready: list[Sequence] = []  # those whose next token is sampled now, in the order of their logits' rows
        blocks: list[torch.Tensor] = []
        if decoding:
            step = self.graphs or self.net.decode_eager
            blocks.append(step([s.tokens[s.n_cached] for s in decoding], [s.slot for s in decoding],
                               [s.n_cached for s in decoding]))
            ready += decoding
            for s in decoding:
                s.n_cached += 1
        chunks = [(s, k) for s, k in plan if s not in decoding]
        width = max((k for _, k in chunks), default=0)
        together = all(s.n_cached + width <= self.cfg.n_ctx_per_seq for s, _ in chunks)  # room for the padding
        for part in [chunks] if together and chunks else [[c] for c in chunks]:  # prompt chunks: one padded pass
            width = max(k for _, k in part)
            g = Group.of([s.tokens[s.n_cached:s.n_cached + k] + [0] * (width - k) for s, k in part],
                         [s.slot for s, _ in part], [s.n_cached for s, _ in part], dev)
            logits = self.net.forward(g, last=[k - 1 for _, k in part])
            ended = []
            for i, (s, k) in enumerate(part):
                self._prompt_total += min(k, max(0, s.n_prompt - s.n_cached))
                s.n_cached += k
                if s.n_cached == len(s.tokens):
                    ended.append(i)
                    ready.append(s)
            if ended:
                blocks.append(logits if len(ended) == len(part) else logits[ended])
        if dev.type == "cuda":  # wait here: the passes' GPU time is decoding's, not the sampler's wait
            torch.cuda.synchronize(self.net.devices[-1])
        t1 = time.perf_counter()
        self._decode_s += t1 - t0
        if not ready:
            return []
        draws = [self._draws[s.request_id] for s in ready]
        want = [s.req.params.top_logprobs if s.req.params.logprobs else -1 for s in ready]
        tokens, lps, tops = sample(blocks[0] if len(blocks) == 1 else torch.cat(blocks), draws, want)
        outs = [self._emit(s, tok, lp, top) for s, tok, lp, top in zip(ready, tokens, lps, tops, strict=True)]
        self._sample_s += time.perf_counter() - t1
        return outs

    def _emit(self, s: Sequence, tok: int, logprob: float | None, top: TopLogprobs | None) -> RequestOutput:
        """Count the sampled token, decide how the answer ends (EOS, max_tokens, the context, a stop string) and
        make its output: new text, stop strings held back, the UTF-8 tail flushed at the end."""
        p = s.req.params
        self._gen_total += 1
        s.n_generated += 1
        end: FinishReason | None = None
        text = ""
        if tok in self.eog and not p.ignore_eos:
            end = "stop"
        else:
            s.tokens.append(tok)
            text, hit = s.stops.feed(s.detok.feed(self.model.pieces[tok]))
            if hit:
                end = "stop"
            elif len(s.tokens) >= self.cfg.n_ctx_per_seq or (p.max_tokens is not None
                                                              and s.n_generated >= p.max_tokens):
                end = "length"
                tail, _ = s.stops.feed(s.detok.flush())
                text += tail + s.stops.flush()
        if end is not None:
            self._retire(s)
        return RequestOutput(s.request_id, text=text, token_ids=[tok], logprobs=None if logprob is None else [logprob],
                             finished=end is not None, finish_reason=end, prompt_tokens=s.n_prompt,
                             completion_tokens=s.n_generated, top_logprobs=None if top is None else [top])

    def _finish(self, s: Sequence, reason: FinishReason) -> RequestOutput:
        self._retire(s)
        return RequestOutput(s.request_id, finished=True, finish_reason=reason, prompt_tokens=s.n_prompt,
                             completion_tokens=s.n_generated)

    def _retire(self, s: Sequence) -> None:
        s.done = s.closed = True
        self._running.remove(s)
        self._draws.pop(s.request_id, None)
        self._free.append(s.slot)
        self._free.sort()
