"""Plain data the engine takes and gives: frozen requests and params in, per-step outputs out.

These are the engine's whole public vocabulary; the worker, consistency checker and bench use them unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Literal

from llamafleet.engine.grammar import check_gbnf
from llamafleet.engine.speculative.settings import SpeculativeConfig

FinishReason = Literal["stop", "length", "cancelled", "error"]
SplitModeName = Literal["none", "layer", "tensor"]
EngineKind = Literal["llama.cpp", "torch"]  # what loads the model: a GGUF file, or a checkpoint folder
KvType = Literal["f16", "q8_0", "q4_0"]
TopLogprobs = list[tuple[int, float]]  # (token id, logprob) of the most likely tokens at one position, best first
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024  # tokens one request may bias
DEFAULT_PRIORITY = 1  # a request's priority unless its API key gives another (0 is admitted first, then 1, then 2)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling, with OpenAI's meanings. ``temperature == 0`` means greedy.

    The defaults here are the only ones: every API route starts from them and passes on only what its client sets
    (OpenAI's for OpenAI's parameters, llama.cpp's for its extensions, :data:`LLAMA_CPP_KNOBS`; docs/API.md).

    ``max_tokens=None`` (OpenAI's "not given") means: until the end of the context per sequence. This is the one
    place that meaning lives; the engine applies it, nothing upstream resolves it.

    ``grammar`` (GBNF text, start rule ``root``) constrains every sampled token, so the answer is a sentence of the
    grammar (structured output: :mod:`llamafleet.engine.grammar`). It ends the answer with end-of-generation once
    complete, so it cannot be combined with ``ignore_eos``.

    Logprobs are the log-softmax of the raw logits (before penalties, temperature or a grammar), as OpenAI reports
    them: ``logprobs`` gives the chosen token's, ``top_logprobs`` (needs ``logprobs``) the N most likely tokens at
    each position too, and ``prompt_logprobs`` every prompt token's as the model scores it given the tokens before
    it (evaluation harnesses' loglikelihood; it computes the whole prompt, the prefix cache is not used for it).
    ``max_tokens=0`` is allowed with ``prompt_logprobs`` alone: the prompt is scored and nothing is generated.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.05
    typical_p: float = 1.0  # locally typical sampling: the tokens closest to the expected surprise; 1 = off
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    grammar: str | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); -100 bans it, +100 forces it
    think_budget: int | None = None  # tokens a thinking model may spend in its think block (engine/budget.py)
    speculative: bool = True  # False: never draft for this request, whatever the engine's speculative settings
    lora: tuple[tuple[str, float], ...] = ()  # LoRA adapters by name, each with its scale (none: the base model)

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1 or (self.max_tokens == 0 and self.prompt_logprobs),
             "max_tokens must be >= 1 (0 only with prompt_logprobs, to score a prompt)"),
            (0 <= self.top_logprobs <= MAX_TOP_LOGPROBS, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]"),
            (self.logprobs or not self.top_logprobs, "top_logprobs needs logprobs"),
            (0.0 <= self.temperature <= 100.0, "temperature must be between 0 and 100"),
            (self.top_k >= 0, "top_k must be >= 0 (0 = off)"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (0.0 < self.typical_p <= 1.0, "typical_p must be in (0, 1] (1 = off)"),
            (self.repeat_penalty > 0.0, "repeat_penalty must be > 0 (1 = off)"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be between -2 and 2"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be between -2 and 2"),
            (self.penalty_last_n >= -1, "penalty_last_n must be >= -1"),
            (self.seed is None or 0 <= self.seed < 2**32, "seed must be in [0, 2**32)"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
            (self.grammar is None or self.grammar.strip() != "", "grammar must not be empty (None = no grammar)"),
            (len(self.logit_bias) <= MAX_LOGIT_BIAS, f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens"),
            (all(t >= 0 and -100.0 <= b <= 100.0 for t, b in self.logit_bias),
             "logit_bias maps token ids (>= 0) to biases between -100 and 100"),
            (self.grammar is None or not self.ignore_eos, "ignore_eos cannot be combined with a grammar: the "
                                                          "grammar ends the answer; drop ignore_eos"),
            (self.think_budget is None or self.think_budget >= 1, "think_budget must be >= 1 (None = no budget)"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        if self.grammar is not None:
            check_gbnf(self.grammar)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def changed(self, names: tuple[str, ...]) -> list[str]:
        """Those of the fields ``names`` that differ from their defaults (what a client set, since every route
        starts from these defaults)."""
        defaults = {f.name: f.default for f in fields(self)}
        return [n for n in names if getattr(self, n) != defaults[n]]


# Sampling knobs as other servers name them (a relay to another OpenAI-compatible server sends them by these names):
OPENAI_KNOBS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")  # OpenAI's own parameters
LLAMA_CPP_KNOBS = ("top_k", "min_p", "typical_p", "repeat_penalty")  # llama.cpp's extensions: its servers take them


class ContextOverflow(ValueError):
    """A request that can never fit the context per sequence: its prompt plus the answer's token limit (or, with no
    limit, the prompt alone, which must leave room for at least one token) exceed ``n_ctx`` tokens. The numbers are
    kept whole so that each API can word them the way its clients recognise."""

    def __init__(self, n_ctx: int, prompt_tokens: int, max_tokens: int | None) -> None:
        self.n_ctx, self.prompt_tokens, self.max_tokens = n_ctx, prompt_tokens, max_tokens
        if max_tokens is None:
            text = (f"the prompt ({prompt_tokens} tokens) leaves no room for an answer in the context per sequence "
                    f"({n_ctx} tokens); shorten the prompt")
        else:
            text = (f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = {prompt_tokens + max_tokens} "
                    f"tokens exceeds the context per sequence ({n_ctx}); shorten the prompt or lower max_tokens")
        super().__init__(text)

    def __reduce__(self) -> tuple[type[ContextOverflow], tuple[int, int, int | None]]:
        return ContextOverflow, (self.n_ctx, self.prompt_tokens, self.max_tokens)  # crosses the worker's pipe

    @classmethod
    def check(cls, n_ctx: int, prompt_tokens: int, max_tokens: int | None) -> None:
        """Raise it if ``prompt_tokens`` and ``max_tokens`` (None: until the context ends) do not fit ``n_ctx``."""
        if prompt_tokens + (1 if max_tokens is None else max_tokens) > n_ctx:
            raise cls(n_ctx, prompt_tokens, max_tokens)


def check_token_ids(tokens: tuple[int, ...], n_vocab: int, where: str = "prompt") -> None:
    """Refuse (``ValueError``) token ids outside the vocabulary, naming the first few and where they are."""
    bad = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < n_vocab]
    if bad:
        raise ValueError(f"token ids out of range [0, {n_vocab}): " + ", ".join(f"{t} at {where} index {i}"
                                                                               for i, t in bad[:5]))


@dataclass(frozen=True)
class Request:
    """One sequence to generate. Give ``prompt_tokens`` (already tokenized, e.g. a chat template's output)."""

    request_id: str
    prompt_tokens: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = DEFAULT_PRIORITY  # waiting requests of a lower number are admitted first (engine/scheduler.py)
    tenant: str = ""  # who asked (an API key's name): slots are shared fairly between tenants of one priority
    # the router's keys of the prompt's text blocks, and the share of the text they cover (engine/held_keys.py)
    prefix_keys: tuple[int, ...] = ()
    prefix_share: float = 1.0


@dataclass
class PromptLogprobs:
    """How the model scores a prompt: ``logprobs[i]`` is that of ``token_ids[i + 1]`` given the tokens before it
    (the first token has none), ``top`` the most likely tokens at each of those positions (when asked for)."""

    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    top: list[TopLogprobs] | None = None


@dataclass(frozen=True)
class CacheOrigin:
    """Where a prompt's reused KV came from, in tokens: a slot (in place or copied), the park, RAM or disk tier;
    for a prompt not served up to its last token, the token index where it first differed from the longest prefix
    any slot or tier held (``differs_at``: a changed system prompt shows as a small number), and for a chat the
    message that token falls in (``differs_in_message``, from 0; set by the worker, which has the messages)."""

    slot: int = 0
    park: int = 0
    ram: int = 0
    disk: int = 0
    differs_at: int | None = None
    differs_in_message: int | None = None


@dataclass
class _Result:
    """What a request's outputs and the :class:`Generation` gathered from them both hold; every field but the
    request's id is given by name."""

    request_id: str
    _: KW_ONLY
    text: str = ""  # in an output: new text since the previous one (never half a UTF-8 character or a stop string)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, how many came from the prefix cache instead of being computed
    error: str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    embeddings: list[bytes] | None = None  # an embedding request's vectors, one per input (see EmbeddingRequest)
    drafted_tokens: int = 0  # speculative decoding: tokens drafted for it so far, and of those the ones the model
    accepted_tokens: int = 0  # kept (each kept token is also one of completion_tokens)
    prompt_ids: list[int] | None = None  # a request only tokenized: its prompt's tokens (nothing is generated)
    cache: CacheOrigin | None = None  # (from a sequence's first output) where its prompt's cached KV came from


@dataclass(kw_only=True)
class RequestOutput(_Result):
    """What one step produced for one request: new text and tokens, and, on the last one, why it ended.

    With logprobs asked for, ``logprobs`` holds each token's, ``top_logprobs`` the top alternatives of each token and
    the first output ``prompt_logprobs``; the engine gives token ids, and the worker fills ``token_bytes`` with the
    bytes of every id those two name (the API process has no vocabulary)."""

    finished: bool = False
    logprobs: list[float] | None = None
    top_logprobs: list[TopLogprobs] | None = None
    token_bytes: dict[int, bytes] | None = None


@dataclass(frozen=True)
class EmbeddingRequest:
    """Embed each of ``inputs`` (token ids): one pooled, L2-normalised vector per input, in order, each as
    little-endian float32 bytes (what OpenAI's ``encoding_format="base64"`` carries), in one finished output whose
    ``prompt_tokens`` counts every input's tokens. See :mod:`llamafleet.engine.embedding`."""

    request_id: str
    inputs: tuple[tuple[int, ...], ...]
    rank: bool = False  # a reranker's request: each input is a query-document pair, its "vector" its raw scores


class EmbeddingUnavailable(RuntimeError):
    """The embedding context cannot be created (memory): embeddings are refused with 503, generation goes on."""


def canonical_lora(chosen: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """LoRA adapters with their scales in one order, scale-0 ones left out (they change nothing): the form of
    :attr:`SamplingParams.lora`, so that requests asking for the same set share a decode (engine/lora.py)."""
    return tuple(sorted((name, float(scale)) for name, scale in chosen if scale != 0.0))


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter a replica loads beside its model: its name (clients pick it as ``model:name``), its GGUF
    file, and the scale it gets when picked by name (engine/lora.py)."""

    name: str
    path: str
    scale: float = 1.0


@dataclass(frozen=True)
class PriorityConfig:
    """How the scheduler favours work of a better class than batch (engine/scheduler.py; the fleet's ``priorities``
    settings): while better work arrived in the last ``reserve_s`` seconds, the last free slot is kept from batch work
    (``reserve_s`` 0: never) and a pass of batch work alone is kept short (its fixed cost at least
    ``batch_alone_cost`` of its time; 0: not kept short); beside a better prompt, batch work adds at most
    ``batch_share`` to the pass's cost (None: no limit, neither rule on passes)."""

    reserve_s: float = 30.0
    batch_share: float | None = 0.1
    batch_alone_cost: float = 0.1


@dataclass(frozen=True)
class EngineConfig:
    """How to load the model and size the context. ``n_ctx_per_seq * n_seq`` is the context's total size."""

    model_path: str
    engine: EngineKind = "llama.cpp"  # "torch": a Hugging Face checkpoint folder (engine/pytorch/)
    n_seq: int = 8
    n_ctx_per_seq: int = 4096
    n_batch: int = 2048  # most tokens per step: the running answers' tokens, then prompt chunks
    n_ubatch: int = 512
    prefill_tokens: int | None = 512  # most prompt tokens per step; None = what the running answers leave of n_batch
    n_threads: int | None = None
    n_gpu_layers: int = -1
    split_mode: SplitModeName = "none"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()  # one share per device: the RPC servers' devices first, then local GPUs
    rpc_servers: tuple[str, ...] = ()  # host:port of llama.cpp RPC servers whose devices take part of the layers
    kv_cache_type: KvType = "f16"
    flash_attn: bool | None = None
    kv_unified: bool = False
    backend_sampling: bool = False  # greedy requests sampled inside llama.cpp's graph (on the GPU); experimental
    overlap: bool = True  # detokenize a step's tokens while the next decode runs (False: one pass at a time)
    prefix_cache: bool = True  # start new sequences from KV already computed for their prompt's prefix
    speculative: SpeculativeConfig = SpeculativeConfig()  # drafts verified in the batched step (engine/speculative/)
    n_park: int = 0  # parked sessions' KV streams in the context beside the slots (0: off; engine/kv_park.py)
    cache_ram_bytes: int = 0  # RAM tier of the KV cache (0: off; engine/kv_tiers.py)
    cache_dir: str | None = None  # disk tier's folder (None: off; engine/kv_disk.py)
    cache_disk_bytes: int = 0
    copy_budget_s: float | None = None  # tier copies per step before prompts wait (None: the last pass's time)
    priorities: PriorityConfig = PriorityConfig()  # better classes over batch work (engine/scheduler.py)
    cuda_graphs: bool = True  # torch engine: decode steps replayed as CUDA graphs on one GPU (False: eager)
    llama_log_level: str = "warning"
    lora: tuple[LoraSpec, ...] = ()  # LoRA adapters loaded beside the model, applied per request (engine/lora.py)


@dataclass(frozen=True)
class TierStats:
    """The KV cache tiers of one engine (:mod:`llamafleet.engine.kv_tiers`); per-tier dicts are keyed "park", "ram",
    "disk"."""

    ram_bytes: int
    ram_limit_bytes: int
    ram_entries: int
    disk_on: bool
    disk_bytes: int
    disk_limit_bytes: int
    disk_entries: int
    hits: dict[str, int]  # prompts that started from a tier's state
    misses: dict[str, int]  # prompts no slot served and that tier did not either
    tokens: dict[str, int]  # prompt tokens restored from each tier
    restore_seconds: dict[str, float]
    saves: int  # states copied out of slots about to be overwritten
    save_seconds: float
    evictions: dict[str, int]  # ram: moved out of RAM (to disk, if on); disk: files deleted for room
    dropped_files: int  # damaged files deleted unread
    failed_restores: int  # states llama.cpp refused
    declined: dict[str, int]  # save, restore: copies not made, slower than prefilling (engine/kv_cost.py)
    deferrals: int  # steps whose copies put a prompt off to the next step
    rates: dict[str, float | None]  # prefill, save, restore_ram, restore_disk: measured seconds per token
    park_entries: int = 0  # sessions parked in the context (engine/kv_park.py)
    park_limit: int = 0  # parked sequences the context holds (0: no park tier)
    parks: int = 0  # slots' KV parked


@dataclass(frozen=True, kw_only=True)
class EngineStats:
    """A snapshot for metrics and routing."""

    slots_total: int
    slots_busy: int
    waiting: int
    kv_tokens_used: int
    kv_tokens_total: int
    steps: int
    prompt_tokens_total: int  # prompt tokens computed (decoded); those taken from the prefix cache are not in it
    generated_tokens_total: int
    decode_seconds_total: float  # inside llama_decode and waiting for its pass to finish
    step_seconds_total: float  # whole steps: decode + batch build + sampling + detokenizing
    sample_seconds_total: float  # choosing the next tokens (reading logits, argmax, sampler chains)
    prompt_tokens_cached_total: int = 0  # prompt tokens whose KV came from the prefix cache
    draft_tokens_total: int = 0  # speculative decoding: tokens drafted and verified
    draft_accepted_total: int = 0  # of those, tokens the model kept
    graph_steps_total: int = 0  # torch engine: decode steps replayed from CUDA graphs (engine/pytorch/graphs.py)
    tiers: TierStats | None = None  # the KV tiers beyond the slots, when on


@dataclass(kw_only=True)
class Generation(_Result):
    """A whole request's result, gathered from its outputs (see :func:`Generation.add`)."""

    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)
    token_bytes: dict[int, bytes] = field(default_factory=dict)

    def add(self, out: RequestOutput) -> None:
        self.text += out.text
        self.cache = out.cache or self.cache
        self.token_ids.extend(out.token_ids)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        self.top_logprobs.extend(out.top_logprobs or [])
        self.prompt_logprobs = out.prompt_logprobs or self.prompt_logprobs
        self.token_bytes.update(out.token_bytes or {})
        self.embeddings = out.embeddings or self.embeddings
        self.prompt_ids = self.prompt_ids if out.prompt_ids is None else out.prompt_ids
        self.prompt_tokens = out.prompt_tokens
        self.completion_tokens = out.completion_tokens
        self.cached_tokens = out.cached_tokens
        self.drafted_tokens, self.accepted_tokens = out.drafted_tokens, out.accepted_tokens
        if out.finished:
            self.finish_reason = out.finish_reason
            self.error = out.error
