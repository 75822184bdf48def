"""The HTTP API's shared shapes: what every route's request models build on, the generate route's request, and the
pydantic models of OpenAI-compatible responses.

Requests are validated strictly (no "1" for 1, no unknown parameters), so a client's mistake is a 400 naming the
parameter; an explicit JSON ``null`` means "not set", as in OpenAI's API (:class:`Request`). Each API family keeps
its request models in a module of its own (:mod:`~llamafleet.api.openai_requests`, :mod:`~llamafleet.api.anthropic`,
:mod:`~llamafleet.api.responses`); error bodies are in :mod:`~llamafleet.api.errors`.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from llamafleet.api.errors import SURROGATE, ApiError
from llamafleet.engine.grammar import check_gbnf
from llamafleet.engine.types import FinishReason, SamplingParams

MAX_STOPS = 16
SEED_LIMIT = 2**32
DEFAULTS = SamplingParams()  # what every route's sampling parameters default to: the engine's, written once


# -- requests --------------------------------------------------------------------------------------------------
def checked_grammar(v: str | None) -> str | None:
    """A request's ``grammar`` (GBNF), checked for what can be checked without a model; ``ValueError`` otherwise."""
    if v is not None:
        if not v.strip():
            raise ValueError("an empty grammar constrains nothing; send GBNF text or null")
        check_unicode([v])
        check_gbnf(v)
    return v


def check_unicode(texts: list[str]) -> None:
    """Text for the model must encode to UTF-8; JSON can spell a lone surrogate (``"\\ud800"``), UTF-8 cannot."""
    if any(not t.isascii() and SURROGATE.search(t) for t in texts):
        raise ValueError("text must be valid Unicode: it holds a lone surrogate (\\ud800-\\udfff), half of a "
                         "UTF-16 pair, which no UTF-8 text can carry")


def check_stops(stops: list[str]) -> None:
    if len(stops) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop strings are allowed, got {len(stops)}")
    if any(not s for s in stops):
        raise ValueError("stop strings must not be empty")
    check_unicode(stops)


MAX_CHOICES = 16  # n: completions of one prompt

class Request(BaseModel):
    """A request body (or a part of one): strict types, no unknown keys, and ``null`` the same as leaving a key out,
    so wrapper code that sends every parameter, most of them ``null``, is served."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class TextPart(Request):
    type: Literal["text"]
    text: str

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        check_unicode([v])
        return v


class Block(Request):
    """A content block (Anthropic) or part (Responses) of any kind: the model reads only text, and the other kinds are
    accepted here so that the refusal can name them (:meth:`text_of`)."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: str
    text: str | None = None

    @field_validator("text")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        check_unicode([v or ""])
        return v

    def text_of(self, param: str, text_kinds: tuple[str, ...]) -> str:
        """The text of this block, which must be one of ``text_kinds``; a 400 naming ``param`` otherwise."""
        if self.type not in text_kinds:
            raise ApiError(400, f"'{param}': {self.type} content is not supported: this server's model reads text "
                                "only", param=param)
        if self.text is None:
            raise ApiError(400, f"missing required parameter '{param}.text'", param=f"{param}.text")
        return self.text


class GenerateRequest(Request):
    """``POST /api/generate``: raw text in, text and timings out."""

    prompt: str
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(DEFAULTS.temperature, ge=0.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    stop: list[str] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        check_stops(v or [])
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str) -> str:
        check_unicode([v])
        return v

    def sampling(self) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed,
                              stop=tuple(self.stop or ()))


# -- responses -------------------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens served from the replica's prefix cache, not computed again


class CompletionTokensDetails(BaseModel):
    """Speculative decoding's drafts, in the fields OpenAI gives its predicted outputs: drafted tokens the model
    kept (each also one of completion_tokens) and drafted tokens it rejected (computed, not part of the answer)."""

    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[Any] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


def _without(out: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    for key in keys:
        if out.get(key) is None:
            out.pop(key, None)
    return out


class FunctionDelta(BaseModel):
    name: str | None = None  # in a call's first delta only
    arguments: str = ""  # the next piece of the arguments' JSON text

    @model_serializer(mode="wrap")
    def _without_name(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without(handler(self), ("name",))


class ToolCallDelta(BaseModel):
    """A piece of a streamed call: the first carries its id, type and name, each its next piece of the arguments
    (the keys a piece does not carry are left out, as OpenAI streams them)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta

    @model_serializer(mode="wrap")
    def _without_later(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without(handler(self), ("id", "type"))


ChatFinish = FinishReason | Literal["tool_calls"]


REASONING_KEYS = ("reasoning_content", "reasoning")  # clients read one or the other: both carry the same text


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None when the answer is tool calls alone
    tool_calls: list[ToolCallOut] | None = None
    reasoning_content: str | None = None  # the model's thinking, when it wrote some (both names, same text)
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _without_empty_reasoning(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without(handler(self), REASONING_KEYS)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: ChatFinish | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _without_empty_tool_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A delta carries ``tool_calls`` (and the reasoning) only when it has some, as OpenAI streams them: clients
        that test for the key (rather than its value) would otherwise read every text delta as a tool call."""
        return _without(handler(self), ("tool_calls", *REASONING_KEYS))


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: ChatFinish | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None for the first token of an echoed prompt
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None


class Completion(BaseModel):
    """A text completion, whole or (with ``object`` the same, as OpenAI does) one streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llamafleet"


class Timings(BaseModel):
    ttft_ms: float = Field(description="request received -> first token")
    total_ms: float
    tokens_per_second: float = Field(description="generated tokens per second after the first one")


class GenerateResponse(BaseModel):
    text: str
    model: str
    finish_reason: FinishReason | None
    usage: Usage
    timings: Timings


class Event(BaseModel):
    """One event of a stream that names its events by their ``type`` (Anthropic's, the Responses API's); its other
    fields are the event's own."""

    model_config = ConfigDict(extra="allow")

    type: str

    @classmethod
    def of(cls, kind: str, **fields: Any) -> Event:
        return cls.model_validate({"type": kind, **fields})


class NamedEvents:
    """How the streams of the APIs that name their events (Anthropic's, the Responses API's) are framed: each chunk
    is an :class:`Event`, and nothing follows the last one."""

    def event(self, chunk: BaseModel) -> str:
        return sse_event(cast(Event, chunk))

    def end(self) -> str:
        return ""


def sse(chunk: BaseModel) -> str:
    """One server-sent event carrying ``chunk`` as JSON."""
    return f"data: {chunk.model_dump_json()}\n\n"


def sse_event(event: Event) -> str:
    """One server-sent event named by its type."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


SSE_DONE = "data: [DONE]\n\n"
