"""OpenAI's request bodies (``/v1/chat/completions``, ``/v1/completions``) and how each becomes engine work.

The kinds of parameters, as docs/API.md lists them:

* honoured: validated with OpenAI's ranges and turned into the engine's
  :class:`~llamafleet.engine.types.SamplingParams` in one place, :meth:`SamplingRequest.sampling` (llama.cpp's
  extra knobs ``top_k``, ``min_p``, ``typical_p``, ``repeat_penalty`` too);
* ignored: standard parameters that mean nothing to this server (``user``, ``store``, ``metadata``, ...), and
  any parameter sent as ``null`` or with its "off" value (``echo: false``, ``tools: []``);
* structured output: ``response_format`` (``json_object``, ``json_schema``) and llama.cpp's ``grammar`` (GBNF)
  become one grammar the engine samples under (:func:`format_grammar`);
* tools: ``tools``, ``tool_choice`` and tool messages, shown to the model and forced by :mod:`~llamafleet.api.tools`
  (:meth:`ChatCompletionRequest.turns`, :attr:`ChatCompletionRequest.constraint`);
* llama-server's own fields (``n_predict``, ``n_probs``, ``cache_prompt``, ...): :mod:`~llamafleet.api.llama_fields`;
* not built yet: each request type lists them in ``not_yet()`` (``modalities`` beyond text, ...),
  and the route refuses the first one used with a 400 naming the parameter
  (:func:`~llamafleet.api.errors.refuse_unbuilt`). A feature that lands removes its line there and adds its field
  to :meth:`SamplingRequest.sampling`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from llamafleet.api.errors import ApiError, NotYet
from llamafleet.api.llama_fields import LlamaServerFields
from llamafleet.api.protocol import (
    DEFAULTS,
    SEED_LIMIT,
    Request,
    TextPart,
    check_stops,
    check_unicode,
    checked_grammar,
)
from llamafleet.api.tools import (
    MAX_TOOLS,
    Tool,
    ToolCall,
    ToolChoice,
    ToolRequest,
    assistant_text,
    calls_grammar,
    offered,
    tool_result_text,
    with_tools,
)
from llamafleet.engine.families import Family
from llamafleet.engine.grammar import after_thinking, json_object_grammar, json_schema_grammar
from llamafleet.engine.template import ToolChat
from llamafleet.engine.types import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, SamplingParams

MAX_CHOICES = 16  # n
MAX_PROMPTS = 64  # a batch of prompts in one /v1/completions request

FUNCTIONS_OLD = "the deprecated functions API is not served; send the functions as 'tools' (and 'tool_choice')"
OFF_TOOL_CHOICES = ("none", "auto")


class ChatMessage(Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # null only in an assistant's turn that made tool calls
    name: str | None = None
    tool_calls: list[ToolCall] = []  # an assistant's earlier calls
    tool_call_id: str | None = None  # which call a tool's result answers
    reasoning_content: str | None = None  # an assistant's earlier thinking (either name), for templates that show it
    reasoning: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[TextPart] | None) -> str | list[TextPart] | None:
        if isinstance(v, str):
            check_unicode([v])
        return v

    @model_validator(mode="after")
    def _complete(self) -> ChatMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("'content' is required (it may be null only in an assistant message with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry 'tool_calls'")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the 'tool_call_id' of the call it answers")
        return self

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text for p in self.content)

    def template_message(self, call_names: dict[str, str]) -> dict[str, Any]:
        """The message as chat templates read it (HF's shape): calls as ``tool_calls``, a tool result with the
        ``tool_call_id`` it answers and that call's function ``name`` (from ``call_names``) when known."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.template_call() for c in self.tool_calls]
        if thought := self.reasoning_content or self.reasoning:
            out["reasoning_content"] = thought  # the template keeps or drops it, as its model expects
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
            if self.tool_call_id in call_names:
                out["name"] = call_names[self.tool_call_id]
        return out

    def turn(self) -> tuple[str, str]:
        """(role, content) for the model's chat template; OpenAI's "developer" role is the older "system", and tool
        calls and results are written out as text (:mod:`~llamafleet.api.tools`)."""
        if self.role == "tool":
            return "user", tool_result_text(self.text())
        if self.tool_calls:
            return "assistant", assistant_text(self.text(), self.tool_calls)
        return ("system" if self.role == "developer" else self.role), self.text()


def chat_turns(messages: list[ChatMessage], tools: list[Tool]) -> tuple[tuple[str, str], ...]:
    """The (role, content) turns of ``messages`` for the model's chat template, ``tools`` listed in the system
    prompt (:func:`~llamafleet.api.tools.with_tools`)."""
    return with_tools([m.turn() for m in messages], tools)


def tool_chat(messages: list[ChatMessage], tools: list[Tool], family: Family | None = None,
              kwargs: dict[str, Any] | None = None) -> ToolChat | None:
    """The conversation for a model whose own template shows tools or is of a known ``family``, with the template
    variables ``kwargs``; None when the model has no family and the conversation holds no tools, calls, results or
    variables (it is then rendered as any chat)."""
    if family is None and not tools and not kwargs and not any(m.tool_calls or m.role == "tool" for m in messages):
        return None
    names = {c.id: c.function.name for m in messages for c in m.tool_calls}
    return ToolChat(tuple(m.template_message(names) for m in messages), tuple(t.spec() for t in tools),
                    tuple(sorted((kwargs or {}).items())))


FormatType = Literal["text", "json_object", "json_schema"]


class JsonSchemaFormat(Request):
    name: str
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not
    description: str | None = None


class ResponseFormat(Request):
    type: FormatType
    json_schema: JsonSchemaFormat | None = None


def format_grammar(kind: FormatType, schema: dict[str, Any] | None, where: str,
                   family: Family | None = None) -> str | None:
    """The GBNF for a structured-output format (None for plain text), after ``family``'s optional think block;
    ``where`` names the schema's parameter, which a ``json_schema`` format needs, in the 400 when it is missing or
    cannot be enforced."""
    if kind == "text":
        return None
    think, text = (None, "") if family is None else (family.think, family.text)
    if kind == "json_object":
        return after_thinking(json_object_grammar(), think, text)
    if schema is None:
        raise ApiError(400, f"missing required parameter '{where}'", param=where)
    try:
        return after_thinking(json_schema_grammar(schema), think, text)
    except ValueError as e:
        raise ApiError(400, f"invalid '{where}': {e}", param=where) from None


def constrained(structured: str | None, grammar: str | None, ignore_eos: bool, param: str) -> str | None:
    """The one grammar a request samples under: its structured output format's (``param``) or its GBNF
    ``grammar``, not both; neither goes with ``ignore_eos``, since the grammar ends the answer."""
    if structured is not None and grammar is not None:
        raise ApiError(400, f"send '{param}' or 'grammar', not both", param="grammar")
    if (structured or grammar) and ignore_eos:
        raise ApiError(400, f"'ignore_eos' cannot be combined with '{param}' or 'grammar': the grammar ends the "
                            "answer; send false or null", param="ignore_eos")
    return structured or grammar


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
        return constrained(None, self.grammar, self.ignore_eos, "grammar")

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
            spec = fmt.json_schema
            where = "response_format.json_schema" if spec is None else "response_format.json_schema.schema"
            structured = format_grammar(fmt.type, None if spec is None else spec.schema_, where, self.family)
        tool = calls_grammar(self.callable, self.tool_choice == "required" and self.parallel_tool_calls,
                             self.family) if self.forced else None
        if tool is not None and (structured or self.grammar):
            raise ApiError(400, "a forced tool call ('tool_choice' \"required\" or a named function) cannot be "
                                "combined with 'response_format' or 'grammar'; send one", param="tool_choice")
        return constrained(structured or tool, self.grammar, self.ignore_eos, "response_format")

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
        kwargs = self.template_kwargs(self.chat_template_kwargs, self.reasoning_effort, "chat_template_kwargs")
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
