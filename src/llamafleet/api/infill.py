"""llama-server's ``POST /infill``: fill in the middle of code, for editor plugins (llama.vim, llama.vscode).

The request carries the code before the cursor (``input_prefix``, then ``prompt``: the current line up to the
cursor), after it (``input_suffix``) and other files (``input_extra``); a replica turns them into the model's
fill-in-the-middle prompt (:mod:`llamafleet.engine.infill`), and a model without FIM tokens is a 400 that says so.
The answer is llama-server's ``/completion`` object (``content``, ``stop``, ``tokens_predicted``,
``tokens_evaluated``, ``tokens_cached``, ``timings``, ...), or with ``stream`` one ``data:`` line per piece of text
and a last one with ``stop: true`` and the totals, no ``[DONE]``. ``response_fields`` picks fields of the whole
answer (``"timings/prompt_n"``: nested), as llama-server does.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from llamafleet.api.aggregate import Choice, plain_overflow, respond
from llamafleet.api.errors import ApiError
from llamafleet.api.llama_fields import LlamaServerNoOps, checked_n_predict
from llamafleet.api.protocol import DEFAULTS, SEED_LIMIT, Usage, check_stops, check_unicode, sse
from llamafleet.api.protocol import Request as Body
from llamafleet.api.service import ServiceDep
from llamafleet.api.tokens import model_service
from llamafleet.engine.infill import Infill
from llamafleet.engine.types import ContextOverflow, FinishReason, SamplingParams
from llamafleet.fleet.dispatch import Delta
from llamafleet.fleet.messages import Submit

routes = APIRouter()

MAX_EXTRA = 256  # files of extra context
# llama-server's own temperature and top_p, which its editor plugins expect; every other default is every route's
LLAMA_SERVER_TEMPERATURE, LLAMA_SERVER_TOP_P = 0.8, 0.95


class ExtraFile(Body):
    filename: str = "tmp"
    text: str

    @field_validator("filename", "text")
    @classmethod
    def _unicode(cls, v: str) -> str:
        check_unicode([v])
        return v


class InfillRequest(LlamaServerNoOps):
    model: str | None = None
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraFile] = Field([], max_length=MAX_EXTRA)
    prompt: str = ""
    n_predict: int = Field(-1, ge=-1, description="-1: until the context ends")
    temperature: float = Field(LLAMA_SERVER_TEMPERATURE, ge=0.0, le=2.0)
    top_k: int = Field(DEFAULTS.top_k, ge=0, lt=2**31)
    top_p: float = Field(LLAMA_SERVER_TOP_P, gt=0.0, le=1.0)
    min_p: float = Field(DEFAULTS.min_p, ge=0.0, le=1.0)
    typical_p: float = Field(DEFAULTS.typical_p, gt=0.0, le=1.0)
    repeat_penalty: float = Field(DEFAULTS.repeat_penalty, gt=0.0, le=10.0)
    presence_penalty: float = Field(DEFAULTS.presence_penalty, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(DEFAULTS.frequency_penalty, ge=-2.0, le=2.0)
    seed: int = Field(-1, ge=-1, lt=SEED_LIMIT, description="-1: random")
    stop: list[str] = []
    stream: bool = False
    response_fields: list[str] = []
    n_probs: int = Field(0, le=0, description="token probabilities are not served here")

    @field_validator("input_prefix", "input_suffix", "prompt")
    @classmethod
    def _unicode(cls, v: str) -> str:
        check_unicode([v])
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str]) -> list[str]:
        check_stops(v)
        return v

    @field_validator("n_predict")
    @classmethod
    def _predict(cls, v: int) -> int:
        checked_n_predict(v)
        return v

    def infill(self) -> Infill:
        return Infill(self.input_prefix, self.input_suffix, self.prompt,
                      tuple((f.filename, f.text) for f in self.input_extra))

    def sampling(self) -> SamplingParams:
        return SamplingParams(max_tokens=None if self.n_predict < 0 else self.n_predict,
                              temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              typical_p=self.typical_p,
                              repeat_penalty=self.repeat_penalty, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, seed=None if self.seed < 0 else self.seed,
                              stop=tuple(self.stop))


class Chunk(BaseModel):
    """One JSON object of the answer (llama-server's fields, as they are)."""

    model_config = ConfigDict(extra="allow")


def picked(answer: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """The fields of ``answer`` that ``paths`` name (``a/b`` reaches into ``a``), under their paths; all of it when
    no path is given."""
    if not paths:
        return answer
    out = {}
    for path in paths:
        value: Any = answer
        for key in path.split("/"):
            value = value.get(key, KeyError) if isinstance(value, dict) else KeyError
        if value is not KeyError:
            out[path] = value
    return out


def _per(n: int, ms: float) -> tuple[float, float]:
    """(ms per token, tokens per second) of ``n`` tokens in ``ms``."""
    return (ms / n if n else 0.0), (n * 1000.0 / ms if ms > 0 else 0.0)


@dataclass
class InfillRenderer:
    """One infill answer, whole or streamed, in llama-server's ``/completion`` shape."""

    body: InfillRequest
    model: str
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finish: FinishReason | None = None  # how a streamed answer ended

    def _final(self, content: str, finish: FinishReason | None, usage: Usage) -> dict[str, Any]:
        now = time.perf_counter()
        first = self.first_token_at or now
        prompt_ms, predicted_ms = (first - self.started) * 1000.0, (now - first) * 1000.0
        cached = usage.prompt_tokens_details.cached_tokens
        computed = usage.prompt_tokens - cached
        predicted = usage.completion_tokens
        return {"index": 0, "content": content, "tokens": [], "id_slot": -1, "stop": True, "model": self.model,
                "tokens_predicted": predicted, "tokens_evaluated": usage.prompt_tokens,
                "has_new_line": "\n" in content, "stop_type": "limit" if finish == "length" else "eos",
                "stopping_word": "", "tokens_cached": cached,
                "timings": {"cache_n": cached, "prompt_n": computed, "prompt_ms": prompt_ms,
                            "prompt_per_token_ms": _per(computed, prompt_ms)[0],
                            "prompt_per_second": _per(computed, prompt_ms)[1],
                            "predicted_n": predicted, "predicted_ms": predicted_ms,
                            "predicted_per_token_ms": _per(predicted, predicted_ms)[0],
                            "predicted_per_second": _per(predicted, predicted_ms)[1]}}

    def opening(self, n_choices: int) -> list[Chunk]:
        return []

    def chunk(self, index: int, delta: Delta) -> list[Chunk]:
        out = delta.output
        if out.token_ids and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.finish = out.finish_reason if out.finished else self.finish
        if not out.text:
            return []
        return [Chunk.model_validate({"index": 0, "content": out.text, "tokens": [], "stop": False, "id_slot": -1,
                                      "tokens_predicted": out.completion_tokens,
                                      "tokens_evaluated": out.prompt_tokens})]

    def closing(self, usage: Usage) -> list[Chunk]:
        return [Chunk.model_validate(picked(self._final("", self.finish, usage), self.body.response_fields))]

    def whole(self, choices: list[Choice], usage: Usage) -> Chunk:
        (choice,) = choices
        self.first_token_at = choice.first_token_at
        gen = choice.generation
        return Chunk.model_validate(picked(self._final(gen.text, gen.finish_reason, usage), self.body.response_fields))

    def event(self, chunk: BaseModel) -> str:
        return sse(chunk)

    def failed(self, error: ApiError) -> str:
        return sse(error.body())

    def end(self) -> str:
        return ""

    def overflow(self, overflow: ContextOverflow) -> ApiError:
        return plain_overflow(overflow)


@routes.post("/infill")
async def infill(body: InfillRequest, request: Request, service: ServiceDep) -> Response:
    service = await model_service(service, body.model)
    group = service.submit([Submit(f"infill-{uuid.uuid4().hex}", body.sampling(), infill=body.infill())])
    render = InfillRenderer(body, service.model_name)
    return await respond(group, render, request, body.stream, 1)
