"""OpenAI's request bodies (``/v1/chat/completions``, ``/v1/completions``) and how each becomes engine work.

The kinds of parameters, as docs/API.md lists them:

* honoured: validated with OpenAI's ranges and turned into the engine's
  :class:`~llamafleet.engine.types.SamplingParams` in one place, :meth:`SamplingRequest.sampling` (llama.cpp's
  extra knobs ``top_k``, ``min_p``, ``typical_p``, ``repeat_penalty`` too);
* ignored: standard parameters that mean nothing to this server (``user``, ``store``, ``metadata``, ...), and
  any parameter sent as ``null`` or with its "off" value (``echo: false``, ``tools: []``);
* structured output: ``response_format`` (``json_object``, ``json_schema``) and llama.cpp's ``grammar`` (GBNF)
  become one grammar the engine samples under (:mod:`~llamafleet.api.structured`);
* messages and tools: chat's messages (:mod:`~llamafleet.api.chat_messages`), ``tools``, ``tool_choice`` and tool
  messages, shown to the model and forced by :mod:`~llamafleet.api.tools` (:meth:`ChatCompletionRequest.turns`,
  :attr:`ChatCompletionRequest.constraint`);
* llama-server's own fields (``n_predict``, ``n_probs``, ``cache_prompt``, ...): :mod:`~llamafleet.api.llama_fields`;
* not built yet: each request type lists them in ``not_yet()`` (``modalities`` beyond text, ...),
  and the route refuses the first one used with a 400 naming the parameter
  (:func:`~llamafleet.api.errors.refuse_unbuilt`). A feature that lands removes its line there and adds its field
  to :meth:`SamplingRequest.sampling`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from llamafleet.api.chat_messages import ChatMessage, chat_turns, tool_chat
from llamafleet.api.errors import ApiError, NotYet
from llamafleet.api.llama_fields import LlamaServerFields
from llamafleet.api.protocol import (
    DEFAULTS,
    MAX_CHOICES,
    SEED_LIMIT,
    Request,
    check_stops,
    check_unicode,
    checked_grammar,
)
from llamafleet.api.structured import ResponseFormat, constrained, format_grammar
from llamafleet.api.tools import (
    MAX_TOOLS,
    Tool,
    ToolChoice,
    ToolRequest,
    calls_grammar,
    offered,
)
from llamafleet.engine.families import Family
from llamafleet.engine.template import ToolChat
from llamafleet.engine.types import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, SamplingParams

MAX_PROMPTS = 64  # a batch of prompts in one /v1/completions request

FUNCTIONS_OLD = "the deprecated functions API is not served; send the functions as 'tools' (and 'tool_choice')"
OFF_TOOL_CHOICES = ("none", "auto")


class StreamOptions(Request):
    include_usage: bool = False
    include_obfuscation: bool = False  # ignored: nothing here pads stream chunks


class SamplingRequest(LlamaServerFields):
    """What chat and text completions share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(DEFAULTS.temperature, ge=0.0, le=2.0)
    top_p: float = Field(DEFAULTS.top_p, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    presence_penalty: float = Field(DEFAULTS.presence_penalty, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(DEFAULTS.frequency_penalty, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] = {}
    # llama.cpp's sampling extensions (LLAMA_CPP_KNOBS)
    top_k: int = Field(DEFAULTS.top_k, ge=0, lt=2**31)
    min_p: float = Field(DEFAULTS.min_p, ge=0.0, le=1.0)
    typical_p: float = Field(DEFAULTS.typical_p, gt=0.0, le=1.0)
    repeat_penalty: float = Field(DEFAULTS.repeat_penalty, gt=0.0, le=10.0)
    ignore_eos: bool = False  # keep generating past end-of-generation tokens (benchmarks)
    grammar: str | None = None  # GBNF, start rule "root"
    speculative: bool = True  # false: no speculative decoding for this request, whatever the model's settings
    # vLLM's: lower first (0 interactive, 1 default, 2 batch), never ahead of the API key's class
    priority: int | None = Field(None, ge=-(2**31), lt=2**31)
    # accepted, ignored
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        check_stops([v] if isinstance(v, str) else v or [])
        return v

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, v: dict[str, float]) -> dict[str, float]:
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens may be biased")
        for key, bias in v.items():
            if not key.isdecimal():
                raise ValueError(f"keys are token ids (decimal integers as strings), not {key[:20]!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"the bias of token {key} must be between -100 and 100, not {bias}")
        return v

    @field_validator("grammar")
    @classmethod
    def _grammar(cls, v: str | None) -> str | None:
        return checked_grammar(v)

    @cached_property
    def constraint(self) -> str | None:
        """The grammar every choice samples under (see :func:`constrained`)."""
        return constrained(self.schema_grammar(), self.grammar, self.ignore_eos, "json_schema")

    def schema_grammar(self, family: Family | None = None) -> str | None:
        """llama-server's top-level ``json_schema`` as a ``response_format`` of type ``json_schema`` gives it (None
        when not sent)."""
        return None if self.json_schema is None else format_grammar("json_schema", self.json_schema, "json_schema",
                                                                     family)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def not_yet(self) -> NotYet:
        """The parameters that need features not built yet (see :func:`~llamafleet.api.errors.refuse_unbuilt`)."""
        return self.samplers_off()

    def top_n(self) -> int:
        """How many top alternatives each token's logprobs come with."""
        return 0

    def think_budget(self) -> int | None:
        """The reasoning budget (only chats have one)."""
        return None

    def sampling(self, max_tokens: int | None, choice: int, logprobs: bool,
                 prompt_logprobs: bool = False) -> SamplingParams:
        """Engine parameters for choice number ``choice`` (seeded choices get ``seed + choice``, so they differ);
        ``prompt_logprobs``: score the prompt's tokens too (``echo``)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            typical_p=self.typical_p,
            repeat_penalty=self.repeat_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            penalty_last_n=self.repeat_last_n,
            seed=None if self.seed is None else (self.seed + choice) % SEED_LIMIT,
            stop=self.stop_strings(),
            logprobs=logprobs,
            top_logprobs=self.top_n() if logprobs else 0,
            prompt_logprobs=prompt_logprobs,
            ignore_eos=self.ignore_eos,
            grammar=self.constraint,
            logit_bias=tuple(sorted((int(token), bias) for token, bias in self.logit_bias.items())),
            think_budget=self.think_budget(),
            speculative=self.speculative,
        )


class ChatCompletionRequest(SamplingRequest, ToolRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)  # needs logprobs: true, as OpenAI's API says
    tools: list[Tool] = Field([], max_length=MAX_TOOLS)
    tool_choice: ToolChoice = "auto"
    functions: list[Any] = []  # the deprecated form of tools
    function_call: str | dict[str, Any] = "auto"
    response_format: ResponseFormat | None = None
    modalities: list[str] = ["text"]
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    reasoning_effort: str | None = None  # given to the chat template (see ToolRequest.template_kwargs)
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_budget: int | None = None  # tokens the think block may take (engine/budget.py)
    # accepted, ignored
    prediction: dict[str, Any] | None = None
    verbosity: str | None = None

    def not_yet(self) -> NotYet:
        return [
            *super().not_yet(),
            ("functions", bool(self.functions), FUNCTIONS_OLD),
            ("function_call", self.function_call not in OFF_TOOL_CHOICES, FUNCTIONS_OLD),
            ("modalities", self.modalities != ["text"], "this server answers with text only; send [\"text\"]"),
            ("audio", self.audio is not None, "this server answers with text only"),
            ("web_search_options", self.web_search_options is not None, "this server cannot search the web"),
        ]

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, v: int, info: ValidationInfo) -> int:
        if v and not info.data.get("logprobs"):
            raise ValueError("it needs 'logprobs': true (the alternatives come with the chosen tokens' logprobs)")
        return v

    @model_validator(mode="after")
    def _n_probs(self) -> ChatCompletionRequest:
        if self.n_probs and not self.logprobs:  # llama-server's name for them; OpenAI's fields win when sent
            self.logprobs, self.top_logprobs = True, self.n_probs
        return self

    @cached_property
    def constraint(self) -> str | None:
        structured = None
        if (fmt := self.response_format) is not None:
            if self.json_schema is not None:
                raise ApiError(400, "send 'response_format' or 'json_schema', not both", param="json_schema")
            spec = fmt.json_schema
            where = "response_format.json_schema" if spec is None else "response_format.json_schema.schema"
            structured = format_grammar(fmt.type, None if spec is None else spec.schema_, where, self.family)
        structured = structured or self.schema_grammar(self.family)
        tool = calls_grammar(self.callable, self.tool_choice == "required" and self.parallel_tool_calls,
                             self.family) if self.forced else None
        if tool is not None and (structured or self.grammar):
            raise ApiError(400, "a forced tool call ('tool_choice' \"required\" or a named function) cannot be "
                                "combined with 'response_format' or 'grammar'; send one", param="tool_choice")
        return constrained(structured or tool, self.grammar, self.ignore_eos,
                           "json_schema" if self.json_schema is not None else "response_format")

    @cached_property
    def callable(self) -> list[Tool]:
        """The tools the model may call (:func:`~llamafleet.api.tools.offered`); their calls are parsed out."""
        return offered(self.tools, self.tool_choice)

    @property
    def forced(self) -> bool:
        """Whether the answer must be tool calls (``tool_choice`` "required" or a named function)."""
        return self.tool_choice != "auto" and bool(self.callable)

    def turns(self) -> tuple[tuple[str, str], ...]:
        """The (role, content) turns for the model's chat template, the callable tools listed in the system
        prompt (:func:`~llamafleet.api.tools.tools_prompt`)."""
        return chat_turns(self.messages, self.callable)

    def tool_chat(self) -> ToolChat | None:
        """The same conversation for a model whose own template shows tools or is of a known family
        (:func:`tool_chat`)."""
        kwargs = self.template_kwargs(self.chat_template_kwargs, self.reasoning_effort, "chat_template_kwargs",
                                      budget=self.think_budget())
        return tool_chat(self.messages, self.callable, self.family, kwargs)

    def top_n(self) -> int:
        return self.top_logprobs

    def think_budget(self) -> int | None:
        return self.budget(self.reasoning_budget, self.token_limit(), "reasoning_budget", self.reasoning_effort)

    def token_limit(self) -> int | None:
        """The answer's token limit, None if the client set none (the rest of the context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def split_prompts(p: str | list[str] | list[int] | list[list[int]]) -> list[str | tuple[int, ...]]:
    """OpenAI's four shapes of a prompt (or an embedding's input) as a list: each one text, or token ids taken as they
    are (the replica checks each id against its vocabulary)."""
    if isinstance(p, str):
        return [p]
    ids = [t for t in p if isinstance(t, int)]
    if ids:
        return [tuple(ids)]  # one prompt of token ids
    return [t if isinstance(t, str) else tuple(t) for t in p if not isinstance(t, int)]


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default for text completions; 0 only to score (echo)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # OpenAI allows up to 5
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, v: str | list[Any]) -> str | list[Any]:
        if isinstance(v, list) and not 1 <= len(v) <= MAX_PROMPTS:
            raise ValueError(f"a list of prompts needs 1 to {MAX_PROMPTS} entries, got {len(v)}")
        check_unicode([p for p in ([v] if isinstance(v, str) else v) if isinstance(p, str)])
        return v

    @model_validator(mode="after")
    def _n_probs(self) -> CompletionRequest:
        if self.n_probs and self.logprobs is None:  # llama-server's name for it; OpenAI's field wins when sent
            self.logprobs = self.n_probs
        return self

    def not_yet(self) -> NotYet:
        return [
            *super().not_yet(),
            ("suffix", bool(self.suffix), "text insertion (fill in the middle) is not offered; send null"),
            ("best_of", self.best_of not in (None, 1, self.n), "choosing the best of several completions is not "
                                                               "offered; send null, or best_of equal to n"),
        ]

    def top_n(self) -> int:
        return self.logprobs or 0

    def prompts(self) -> list[str | tuple[int, ...]]:
        return split_prompts(self.prompt)

    def scores_prompt(self, prompt: str | tuple[int, ...]) -> bool:
        """Whether ``prompt``'s tokens are scored: with ``echo`` and ``logprobs``, or to echo token ids as text. The
        one use of ``max_tokens: 0`` (score a prompt, generate nothing) is checked here, for a 400 naming it."""
        if self.max_tokens == 0 and not (self.echo and self.logprobs is not None):
            raise ApiError(400, "invalid 'max_tokens': 0 is allowed only with echo and logprobs, to score the "
                                "prompt; send 1 or more", param="max_tokens")
        return self.echo and (self.logprobs is not None or not isinstance(prompt, str))
