"""Every message that crosses the boundary between the API process and a worker process, in one place.

Messages are frozen dataclasses sent whole, pickled in length-prefixed frames, over one duplex pipe per worker (see
:mod:`llamafleet.fleet.pipe`; a message may be of any size). Direction:

* API -> worker: :class:`Submit`, :class:`Abort`, :class:`Shutdown`, :class:`SetAdapters`.
* worker -> API: :class:`LoadProgress` and then :class:`Ready` or :class:`LoadFailed` while loading (the readiness
  handshake), then one :class:`StepOutputs` per engine step that produced anything: every sequence's new tokens of
  that step travel together, with the engine's stats riding along (never one message per token per request), and a
  :class:`Heartbeat` whenever the engine loop has sent nothing for its beat interval: silence past the server's
  ``heartbeat_timeout_s`` means the worker is hung; and a :class:`Pulse` from another thread while the engine is in a
  step longer than that interval: a worker silent even of pulses is suspect (``suspect_after_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llamafleet.engine.held_keys import HeldChange
from llamafleet.engine.infill import Infill
from llamafleet.engine.template import ToolChat
from llamafleet.engine.types import (
    DEFAULT_PRIORITY,
    ContextOverflow,
    EngineStats,
    LoraSpec,
    RequestOutput,
    SamplingParams,
)

ChatTurn = tuple[str, str]  # (role, content)


# -- API process -> worker -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """Generate one sequence. The worker tokenizes: ``chat`` (through the model's chat template) or ``prompt``
    (with the model's BOS and such when ``add_special``, special-token spellings parsed when ``parse_special``);
    ``prompt_ids`` (a client's token-id prompt) is taken as it is, no tokenizing, nothing added; ``infill`` (code
    around a cursor) becomes the model's fill-in-the-middle prompt (a 400 for a model without FIM tokens). A chat
    with tools carries them in ``tools`` too, for a model whose own template shows tools (``chat`` is their generic
    rendering, the tools in the system prompt, used otherwise: see
    :meth:`~llamafleet.engine.engine.Engine.tokenize_chat`).

    With ``tokenize_only`` nothing is generated: the answer is one finished output (finish reason ``length``, as a
    limit of zero tokens would end it), context or not, that carries the prompt's tokens: ``prompt_ids``, their count
    in ``prompt_tokens``, each distinct id's bytes in ``token_bytes`` and the whole as ``text``, control tokens written
    out (``<|im_start|>``); a chat's text leaves out the BOS the tokenizer adds (see
    :meth:`~llamafleet.engine.textside.TextSide.tokens_output`).

    With ``embed`` nothing is generated either: each input (a text, tokenized with the model's special tokens, or
    token ids taken as they are) is embedded, and the one finished output carries the vectors in order
    (``RequestOutput.embeddings``); ``params`` is not used. With ``rerank`` (a query and its documents), a reranker
    scores each query-document pair the same way: each "vector" is the pair's raw scores, the first its relevance.
    """

    request_id: str
    params: SamplingParams
    prompt: str = ""
    chat: tuple[ChatTurn, ...] | None = None
    tools: ToolChat | None = None
    prompt_ids: tuple[int, ...] | None = None
    infill: Infill | None = None
    add_special: bool = True
    parse_special: bool = False
    tokenize_only: bool = False
    embed: tuple[str | tuple[int, ...], ...] | None = None
    priority: int = DEFAULT_PRIORITY  # the engine admits lower first (see engine/scheduler.py)
    tenant: str = ""  # the key's name, for fair shares between keys of one priority
    rerank: tuple[str, tuple[str, ...]] | None = None
    # the router's keys of ``routing_prompt``'s blocks and the share of its text they cover (fleet/affinity.py):
    # the engine reports which of them its KV holds (engine/held_keys.py)
    prefix_keys: tuple[int, ...] = ()
    prefix_share: float = 1.0

    @property
    def routing_prompt(self) -> str | tuple[ChatTurn, ...]:
        """What prefix routing compares (:mod:`~llamafleet.fleet.affinity`): a chat's messages, an infill's text in
        the order its prompt lays it out (other files, then the code up to the cursor, then after it), or the
        prompt."""
        if self.chat is not None:
            return self.chat
        if self.infill is not None:
            i = self.infill
            return "".join(f"{name}\n{text}\x1e" for name, text in i.extra) + f"\x1d{i.prefix}{i.prompt}\x1d{i.suffix}"
        return self.prompt


@dataclass(frozen=True)
class Abort:
    """Cancel a request; it comes back finished with ``finish_reason="cancelled"`` (unknown ids are ignored)."""

    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """Cancel everything in flight, report it, free the engine and exit."""


@dataclass(frozen=True)
class SetAdapters:
    """Make ``adapters`` the replica's LoRA adapters: new ones loaded, the others unloaded once no request uses them
    (:mod:`llamafleet.engine.lora`). Sent before the requests that name a new one, on the same pipe."""

    adapters: tuple[LoraSpec, ...]


ToWorker = Submit | Abort | Shutdown | SetAdapters


# -- worker -> API process -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadProgress:
    """How far the model load has come (0..1)."""

    fraction: float


@dataclass(frozen=True, kw_only=True)
class Ready:
    """The engine is loaded and accepting work (the end of the readiness handshake). ``family``: the model family its
    chat template was recognised as (:mod:`llamafleet.engine.families`; None: the generic path), which tells the API
    how the model writes its reasoning and tool calls. ``reranker``: the model scores query-document pairs (its
    pooling type is ``rank``) and does nothing else. ``reports_held``: its step outputs report which prefix keys its
    KV holds (:attr:`StepOutputs.held`); the router then counts those, not what it sent there. ``disk_tier``: where its
    disk tier is (host and folder): replicas naming the same one share it (a state one spilled, another restores)."""

    pid: int
    n_seq: int
    n_ctx_per_seq: int
    load_seconds: float
    family: str | None = None
    reranker: bool = False
    reports_held: bool = False
    disk_tier: str | None = None


@dataclass(frozen=True)
class LoadFailed:
    """The engine could not be loaded; the worker exits after sending this."""

    message: str


@dataclass(frozen=True)
class Rejected:
    """A :class:`Submit` that never started, with the HTTP status to answer: 400 (the request itself is at fault),
    503 (the replica is shutting down: retry elsewhere or later) or 500 (the replica failed on it). ``overflow`` holds
    the numbers when the prompt cannot fit the context (each API words them its own way)."""

    request_id: str
    message: str
    status: int
    overflow: ContextOverflow | None = None


@dataclass(frozen=True, kw_only=True)
class StepOutputs:
    """Everything one engine step produced on one worker.

    ``pieces`` holds, for requests that asked for logprobs only, the bytes of each token in the matching output's
    ``token_ids`` (the API process has no vocabulary); the bytes of the ids named by top logprobs and prompt scores
    ride in each output's ``token_bytes``. ``held``: the router's prefix keys the engine's KV gained and lost in
    the step (:mod:`llamafleet.engine.held_keys`); a step that changed them is sent even without outputs.
    """

    outputs: list[RequestOutput]
    rejected: list[Rejected]
    pieces: dict[str, list[bytes]]
    stats: EngineStats
    held: HeldChange | None = None


@dataclass(frozen=True)
class Heartbeat:
    """The engine loop is alive and has had nothing else to send for one beat interval."""


@dataclass(frozen=True)
class Pulse:
    """The worker process is alive, though nothing was sent for one beat interval (its engine is in a long step):
    sent by a thread beside the engine's, it keeps a replica from being suspected (:mod:`llamafleet.fleet.suspicion`),
    never from being found hung."""


FromWorker = LoadProgress | Ready | LoadFailed | StepOutputs | Heartbeat | Pulse
