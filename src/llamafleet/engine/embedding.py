"""Embeddings beside continuous batching: a second, small llama.cpp context on the engine's loaded model.

Why a second context, rather than switching the generation context into embeddings mode between steps
(``llama_set_embeddings``): that context's KV cache is cut into slots, each owned by a running answer or kept for the
prefix cache, so an input to embed would have to take a slot (and evict a cached prefix); and a pass in embeddings
mode outputs every token, so no generation could share it. The second context shares the weights (nothing is copied)
and has a cache of its own; it is created on the first embedding request, so a server never asked for one pays
nothing. What it costs once created: a KV cache of ``n_ctx_per_seq`` tokens (one slot's worth) shared by up to
:data:`MAX_INPUTS_PER_PASS` inputs, and compute buffers for :attr:`Embedder.n_batch` tokens. For a generative model
llama.cpp also computes the output layer for every token of such a pass and keeps ``n_vocab`` floats per token on the
host (100 MB for the demo model's 49k-token vocabulary at 512 tokens), so a pass is capped at :data:`MAX_BATCH`
tokens. The planner does not count this memory.

Scheduling: :meth:`~llamafleet.engine.engine.Engine.step` runs at most one embedding pass per step, after it has
launched the generation pass: of at most :attr:`Embedder.n_batch` tokens while no answer is being generated, and of a
quarter of that (:data:`SHARE_WHILE_GENERATING`) while answers are, so that each of their tokens waits for a
quarter-size pass at most. Measured on the demo model, one CPU thread, in CPU time (the machine was shared), an
answer of 24 tokens beside 3 inputs of 1000 tokens: alone, 16 ms between its tokens; beside 512-token passes, 3.3-3.5 s
at each of the six passes; beside 128-token passes, 0.85-0.94 s at every token; the inputs took 20 s either way.

A long input is embedded in chunks over several steps (its KV stays in this context between them). Inputs are packed
into a pass together, each its own sequence id; they join in waves: as many as fit the cache (and the sequence ids)
start together, and the next wave starts, on a cleared cache, once all of them are done.

Pooling: llama.cpp pools per micro-batch (a chunked input would be pooled over its last chunk only), so this context
outputs every token's final hidden state (after the output norm: what llama.cpp's pooling reads) and the pooling is
done here, by the model's own pooling type from its metadata (``{arch}.pooling_type``: mean, first token (CLS) or
last token), else by the mean over the input's tokens. That is the choice for generative models: llama-server takes
their pooling from the metadata too, finds none, and refuses OpenAI-style embeddings until started with ``--pooling``
(``mean`` or ``last``); mean uses every token. Every vector is then L2-normalised, as llama-server does (its
``embd_normalize`` defaults to 2, the Euclidean norm).

Rerankers (pooling ``rank``) score, they do not embed: they are refused embeddings, and rerank requests
(``EmbeddingRequest.rank``) go to them alone. Each input is one query-document pair (:meth:`Embedder.pairs`, laid out
as llama-server lays it), packed into the same passes as embedding inputs; the context pools in llama.cpp's graph,
where the model's classifier head runs on the pooled state, and an input's scores (``n_cls_out`` floats, raw, not
normalised; the first is the relevance score) are read once its last token has been through a pass.

Encoder-only models (BERT-likes: ``{arch}.attention.causal`` is false) attend across the whole input and keep no KV
cache in llama.cpp, so an input is embedded in one pass, whole, and is at most ``min(n_ctx_per_seq, n_ctx_train)``
tokens long (BERT's position table ends there; others were not trained past it). A pass holds whole inputs, up to
``n_batch`` tokens of them (or one input of that limit, if it is longer): fewer, larger passes, as llama-server packs
its slots' inputs into one micro-batch; on a shared 2-core CPU, 64 query-document pairs of 208 tokens through a
6-layer, 384-wide encoder took 58-76 s in passes of 2048 tokens against 116-142 s in passes of 512. Such a model
cannot generate; the engine refuses to.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from llamafleet.engine.llama import Batch, Context, Model
from llamafleet.engine.types import (
    ContextOverflow,
    EmbeddingRequest,
    EmbeddingUnavailable,
    EngineConfig,
    FinishReason,
    RequestOutput,
    check_token_ids,
)

MAX_INPUTS_PER_PASS = 32  # inputs in one pass, each its own sequence id
MAX_BATCH = 512  # tokens in one pass of a generative model (see above: llama.cpp computes logits for each)
SHARE_WHILE_GENERATING = 4  # while answers are generated, a pass takes n_batch / 4 tokens
MEAN, CLS, LAST, RANK = 1, 2, 3, 4  # llama.cpp's llama_pooling_type values

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    """One request: its vectors so far, by input index."""

    request_id: str
    n_inputs: int
    n_tokens: int
    vectors: dict[int, bytes] = field(default_factory=dict)


@dataclass(eq=False)
class _Input:
    job: _Job
    index: int
    tokens: tuple[int, ...]
    seq: int = 0  # its sequence id in this wave
    done: int = 0  # tokens already through a pass
    pooled: npt.NDArray[np.float64] | None = None  # the sum of its hidden states (mean), or the one row it keeps


class Embedder:
    """Embeds :class:`EmbeddingRequest` inputs in passes of a second context over ``model``; the engine steps it."""

    def __init__(self, model: Model, cfg: EngineConfig) -> None:
        self.model = model
        self.pooling = model.pooling if model.pooling in (MEAN, CLS, LAST, RANK) else MEAN
        self.reranks = model.reranks  # it scores query-document pairs, and embeds nothing
        self.limit = cfg.n_ctx_per_seq if model.causal else min(cfg.n_ctx_per_seq, model.n_ctx_train)
        self.n_batch = min(cfg.n_batch, MAX_BATCH) if model.causal else max(self.limit, cfg.n_batch)
        self.n_seq = min(MAX_INPUTS_PER_PASS, self.n_batch)  # llama.cpp keeps an output row per sequence id
        self._cfg = dataclasses.replace(cfg, n_seq=self.n_seq, n_batch=self.n_batch, kv_unified=True,
                                        n_ubatch=min(cfg.n_ubatch, self.n_batch) if model.causal else self.n_batch,
                                        backend_sampling=False)
        self._ctx: Context | None = None
        self._batch: Batch | None = None
        self._incoming: deque[EmbeddingRequest] = deque()  # appended from any thread, drained by the stepping one
        self._queue: deque[_Input] = deque()
        self._active: list[_Input] = []

    def pairs(self, query: str, documents: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """Each of ``documents`` with ``query`` as a reranker reads the pair, as llama-server lays it out: the GGUF's
        ``rerank`` template with ``{query}`` and ``{document}`` filled in (special tokens in it parsed), else
        ``[BOS] query [EOS] [SEP] document [EOS]``, each marker only where the vocabulary asks for it."""
        template = self.model.chat_template("rerank")
        if template is not None:
            return tuple(tuple(self.model.tokenize(template.replace("{query}", query).replace("{document}", doc),
                                                   add_special=False, parse_special=True)) for doc in documents)
        bos, eos, sep = ([t] if t >= 0 else [] for t in self.model.pair_markers())
        q = self.model.tokenize(query, add_special=False)
        return tuple(tuple(bos + q + eos + sep + self.model.tokenize(doc, add_special=False) + eos)
                     for doc in documents)

    def check(self, req: EmbeddingRequest) -> None:
        """Raise ``ValueError`` (:class:`ContextOverflow` for an input too long) if ``req`` can never run here."""
        if self.reranks and not req.rank:
            raise ValueError("this model is a reranker (its pooling type is 'rank'): it scores text pairs and "
                             "gives no embeddings; use POST /v1/rerank, or serve an embedding model")
        if req.rank and not self.reranks:
            raise ValueError("this model is not a reranker (its pooling type is not 'rank'): it cannot score "
                             "query-document pairs; serve a reranker GGUF")
        if not req.inputs:
            raise ValueError("there is no input to embed")
        for i, tokens in enumerate(req.inputs):
            if not tokens:
                raise ValueError(f"input {i} is empty: every input must contain at least one token")
            ContextOverflow.check(self.limit, len(tokens), 0)
            check_token_ids(tokens, self.model.n_vocab, f"input {i}")

    def add(self, req: EmbeddingRequest) -> None:
        """Queue ``req`` (checked now); :class:`EmbeddingUnavailable` if the embedding context cannot be created
        (memory): the replica keeps serving, the request is refused."""
        self.check(req)
        if (failed := self._open()) is not None:
            raise EmbeddingUnavailable(failed)
        self._incoming.append(req)

    def _take_incoming(self) -> None:
        while self._incoming:
            req = self._incoming.popleft()
            job = _Job(req.request_id, len(req.inputs), sum(len(t) for t in req.inputs))
            self._queue.extend(_Input(job, i, t) for i, t in enumerate(req.inputs))

    def has_work(self) -> bool:
        return bool(self._incoming or self._queue or self._active)

    def abort(self, request_id: str) -> list[RequestOutput]:
        """Drop the request's inputs; its one output, ``cancelled`` (none if it is not here)."""
        self._take_incoming()
        job = next((i.job for i in (*self._active, *self._queue) if i.job.request_id == request_id), None)
        return [] if job is None else [self._end(job, "cancelled")]

    def step(self, generating: bool = False) -> list[RequestOutput]:
        """One pass of at most :attr:`n_batch` tokens (a quarter of that while answers are ``generating``, unless
        the inputs must go whole: encoders); the requests whose every input is now embedded."""
        self._take_incoming()
        if not self._active:
            self._start_wave()
        if not self._active:
            return []
        assert self._ctx is not None and self._batch is not None
        size = self.n_batch // SHARE_WHILE_GENERATING if generating and self.model.causal else self.n_batch
        plan, budget = [], max(1, size)
        for inp in self._active:
            if budget == 0:
                break
            k = min(len(inp.tokens) - inp.done, budget)
            plan.append((inp, k))
            budget -= k
        b, n = self._batch, max(1, size) - budget
        b.token[:n] = [t for inp, k in plan for t in inp.tokens[inp.done:inp.done + k]]
        b.pos[:n] = [p for inp, k in plan for p in range(inp.done, inp.done + k)]
        b.seq[:n] = [inp.seq for inp, k in plan for _ in range(k)]
        b.logits[:n] = 1  # llama.cpp's embeddings mode wants every token output
        b.n_tokens = n
        rc = self._ctx.launch(b)
        self._ctx.wait()
        if rc != 0:
            message = f"llama_decode failed with status {rc} on an embedding pass of {n} tokens"
            log.error("%s", message)
            return [self._end(job, "error", message) for job in dict.fromkeys(i.job for i in self._active)]
        rows, first, outs = None if self.reranks else self._ctx.embeddings(n), 0, []
        for inp, k in plan:
            if rows is not None:
                self._pool(inp, rows[first:first + k])
            first, inp.done = first + k, inp.done + k
            if inp.done == len(inp.tokens):
                if rows is None:  # pooled and scored in the graph
                    inp.pooled = self._ctx.sequence_scores(inp.seq, self.model.n_cls_out).astype(np.float64)
                outs += self._finish(inp)
        self._active = [i for i in self._active if i.done < len(i.tokens)]
        return outs

    # -- waves, pooling, ends ---------------------------------------------------------------------------------
    def _start_wave(self) -> None:
        """Take the next inputs that fit together: the cache (a pass, for encoders) and the sequence ids."""
        assert self._ctx is not None
        self._ctx.clear_all()
        room = self._ctx.n_ctx if self.model.causal else self.n_batch
        while self._queue and len(self._active) < self.n_seq and len(self._queue[0].tokens) <= room:
            inp = self._queue.popleft()
            inp.seq = len(self._active)
            room -= len(inp.tokens)
            self._active.append(inp)

    def _pool(self, inp: _Input, rows: npt.NDArray[np.float32]) -> None:
        if self.pooling == MEAN:
            total = rows.sum(axis=0, dtype=np.float64)
            inp.pooled = total if inp.pooled is None else inp.pooled + total
        elif self.pooling == CLS and inp.done == 0:
            inp.pooled = rows[0].astype(np.float64)
        elif self.pooling == LAST and inp.done + len(rows) == len(inp.tokens):
            inp.pooled = rows[-1].astype(np.float64)

    def _finish(self, inp: _Input) -> list[RequestOutput]:
        assert inp.pooled is not None
        vector = inp.pooled if self.reranks else normalized(inp.pooled)
        inp.job.vectors[inp.index] = vector.astype("<f4").tobytes()
        if len(inp.job.vectors) < inp.job.n_inputs:
            return []
        return [self._end(inp.job, "stop")]

    def _end(self, job: _Job, reason: FinishReason, error: str | None = None) -> RequestOutput:
        """Take ``job`` out (queued and running inputs alike) and make its one output."""
        self._queue = deque(i for i in self._queue if i.job is not job)
        self._active = [i for i in self._active if i.job is not job]
        vectors = [job.vectors[i] for i in range(job.n_inputs)] if reason == "stop" else None
        return RequestOutput(job.request_id, finished=True, finish_reason=reason, prompt_tokens=job.n_tokens,
                             error=error, embeddings=vectors)

    def _open(self) -> str | None:
        """Create the context on first use; why it could not be, if it could not."""
        if self._ctx is None:
            try:
                self._ctx = Context(self.model, self._cfg, n_ctx=self.limit, embeddings=True)
            except (RuntimeError, ValueError) as e:
                log.error("the embedding context could not be created: %s", e)
                return (f"this replica cannot compute embeddings now: its embedding context could not be created "
                        f"({e}); it needs memory beside the model's own context (docs/OPERATIONS.md, Embeddings); "
                        "retry later, or free memory on the replica's device")
            self._batch = Batch(self.n_batch)
        return None

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


def normalized(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``v`` scaled to unit Euclidean length (a zero vector stays zero)."""
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v
