"""The HTTP API's shapes: pydantic models of OpenAI-compatible requests and responses, and OpenAI error bodies.

Requests are validated strictly (no "1" for 1, no unknown parameters) with OpenAI's ranges, so a client's mistake is
a 400 naming the parameter. llama.cpp's extra sampling knobs (``top_k``, ``min_p``, ``repeat_penalty``) are
accepted too. :meth:`SamplingRequest.sampling` turns a request into the engine's
:class:`~llamafleet.engine.types.SamplingParams` for the i-th choice.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.responses import JSONResponse

from llamafleet.engine.types import FinishReason, SamplingParams

MAX_CHOICES = 16  # n
MAX_PROMPTS = 64  # a batch of prompts in one /v1/completions request
MAX_STOPS = 16
SEED_LIMIT = 2**32
SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair: JSON can carry one, UTF-8 cannot

log = logging.getLogger(__name__)


# -- errors ----------------------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """Raised by handlers; becomes an OpenAI error body with ``status`` (and ``headers``, e.g. ``Retry-After``)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> ErrorResponse:
        """The OpenAI error body. Client text echoed in it (a model name, a parameter name) may hold lone surrogates,
        which no UTF-8 body can carry: they become U+FFFD here, the one place every error body passes."""
        param = None if self.param is None else utf8_safe(self.param)
        return ErrorResponse(error=ErrorDetail(message=utf8_safe(self.message), type=error_type(self.status),
                                               param=param, code=self.code))


def error_response(exc: ApiError) -> JSONResponse:
    """The HTTP response of ``exc``: its OpenAI error body, status and headers."""
    return JSONResponse(exc.body().model_dump(), status_code=exc.status, headers=exc.headers)


def utf8_safe(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so that it always encodes to UTF-8."""
    return text if text.isascii() else SURROGATE.sub("\ufffd", text)


def internal_error(what: str, exc: BaseException | None = None) -> ApiError:
    """A 500 that tells the client nothing of the server's insides, and the log line (with ``exc``'s traceback) that
    tells the operator everything; both carry the same error id, so one finds the other."""
    error_id = f"err-{uuid.uuid4().hex[:16]}"
    log.error("internal error %s: %s", error_id, what, exc_info=exc)
    return ApiError(500, f"internal server error (error id {error_id}); retry the request, and give the operator "
                         "the id if it keeps failing", code="internal_error")


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    special = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
    if status in special:
        return special[status]
    return "invalid_request_error" if status < 500 else "server_error"


# -- requests --------------------------------------------------------------------------------------------------
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


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        check_unicode([v])
        return v


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[TextPart]) -> str | list[TextPart]:
        if isinstance(v, str):
            check_unicode([v])
        return v

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def turn(self) -> tuple[str, str]:
        """(role, content) for the model's chat template; OpenAI's "developer" role is the older "system"."""
        return ("system" if self.role == "developer" else self.role), self.text()


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingRequest(_Strict):
    """What chat and text completions share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    # llama.cpp's sampling extensions, with its defaults
    top_k: int = Field(40, ge=0, lt=2**31)
    min_p: float = Field(0.05, ge=0.0, le=1.0)
    repeat_penalty: float = Field(1.0, gt=0.0, le=10.0)
    ignore_eos: bool = False  # keep generating past end-of-generation tokens (benchmarks)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        check_stops([v] if isinstance(v, str) else v or [])
        return v

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def sampling(self, max_tokens: int | None, choice: int, logprobs: bool) -> SamplingParams:
        """Engine parameters for choice number ``choice`` (seeded choices get ``seed + choice``, so they differ)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=None if self.seed is None else (self.seed + choice) % SEED_LIMIT,
            stop=self.stop_strings(),
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
        )


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top(cls, v: int | None) -> int | None:
        if v:
            raise ValueError("top alternatives are not offered; use logprobs=true alone for the chosen tokens")
        return v

    def token_limit(self) -> int | None:
        """The answer's token limit, None if the client set none (the rest of the context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for text completions
    logprobs: int | None = None

    @field_validator("logprobs")
    @classmethod
    def _top(cls, v: int | None) -> int | None:
        if v:
            raise ValueError("top alternatives are not offered; use logprobs=0 for the chosen tokens' logprobs")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not 1 <= len(v) <= MAX_PROMPTS:
            raise ValueError(f"a list of prompts needs 1 to {MAX_PROMPTS} entries, got {len(v)}")
        check_unicode([v] if isinstance(v, str) else v)
        return v

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class GenerateRequest(_Strict):
    """The seed service's ``POST /api/generate``: raw text in, text and timings out."""

    prompt: str
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.8, ge=0.0, le=2.0)
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


# -- responses -------------------------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens served from the replica's prefix cache, not computed again


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[Any] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None


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


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
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


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


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


def sse(chunk: BaseModel) -> str:
    """One server-sent event carrying ``chunk`` as JSON."""
    return f"data: {chunk.model_dump_json()}\n\n"


SSE_DONE = "data: [DONE]\n\n"
