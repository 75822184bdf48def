"""llama-server's token routes: ``POST /tokenize``, ``/detokenize`` and ``/apply-template``, in its request and answer
shapes, plus a ``model`` field that picks the model when several are served (the first configured one otherwise).

The API process has no vocabulary: every route here sends one tokenize-only :class:`~llamafleet.fleet.messages.Submit`
to a replica of the model, which answers with the tokens and their text without generating anything
(:func:`tokenized`). ``/v1/messages/count_tokens`` goes the same way. ``/apply-template`` takes a chat completion's
body (messages, tools, ``tool_choice``) and renders it exactly as ``/v1/chat/completions`` would, then answers the
prompt's text: tokenizing that text again with special tokens parsed (and the BOS added, as a prompt is) gives the
very tokens a chat completion's prompt holds.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, field_validator

from llamafleet.api.aggregate import collect
from llamafleet.api.errors import ApiError, refuse_unbuilt
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.protocol import Request as Body
from llamafleet.api.protocol import check_unicode
from llamafleet.api.service import Service, ServiceDep
from llamafleet.engine.template import ToolChat
from llamafleet.engine.types import Generation, SamplingParams
from llamafleet.fleet.messages import ChatTurn, Submit

routes = APIRouter()


async def tokenized(service: Service, request: Request, *, prompt: str = "", chat: tuple[ChatTurn, ...] | None = None,
                    tools: ToolChat | None = None, prompt_ids: tuple[int, ...] | None = None,
                    add_special: bool = True, parse_special: bool = False) -> Generation:
    """The tokens of a prompt, a chat (through the model's template) or token ids, from a replica of ``service``'s
    model: ``prompt_ids``, ``prompt_tokens``, ``token_bytes`` and ``text`` of the result are set."""
    group = service.submit([Submit(f"tok-{uuid.uuid4().hex}", SamplingParams(), prompt=prompt, chat=chat, tools=tools,
                                   prompt_ids=prompt_ids, add_special=add_special, parse_special=parse_special,
                                   tokenize_only=True)])
    try:
        (choice,) = await collect(group, request)
    finally:
        group.close()
    return choice.generation


async def model_service(service: Service, model: str | None) -> Service:
    """``service`` bound to ``model``, or to the first configured model when none is named."""
    return await service.for_model(service.model_name if model is None else model)


class TokenizeRequest(Body):
    model: str | None = None
    content: str
    add_special: bool = False  # the model's BOS (and such) first
    parse_special: bool = True  # special-token spellings (<|im_start|>) become those tokens
    with_pieces: bool = False

    @field_validator("content")
    @classmethod
    def _unicode(cls, v: str) -> str:
        check_unicode([v])
        return v


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]


class ApplyTemplateRequest(ChatCompletionRequest):
    """A chat completion's body; ``model`` may be left out here."""

    model: str | None = None  # type: ignore[assignment]
    add_generation_prompt: bool = Field(True, description="only true: a chat prompt ends where the answer begins")


def piece(raw: bytes) -> str | list[int]:
    """A token's piece as llama-server writes it: its text when the bytes are whole UTF-8, otherwise the bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


@routes.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request, service: ServiceDep) -> dict[str, Any]:
    service = await model_service(service, body.model)
    gen = await tokenized(service, request, prompt=body.content, add_special=body.add_special,
                          parse_special=body.parse_special)
    ids = gen.prompt_ids or []
    if not body.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": piece(gen.token_bytes[t])} for t in ids]}


@routes.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request, service: ServiceDep) -> dict[str, str]:
    service = await model_service(service, body.model)
    gen = await tokenized(service, request, prompt_ids=tuple(body.tokens))
    return {"content": gen.text}


@routes.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, request: Request, service: ServiceDep) -> dict[str, str]:
    service = await model_service(service, body.model)
    refuse_unbuilt(body.not_yet())
    if not body.add_generation_prompt:
        raise ApiError(400, "'add_generation_prompt': only true is served: a chat prompt here always ends where "
                            "the assistant's answer begins", param="add_generation_prompt",
                       code="unsupported_parameter")
    gen = await tokenized(service, request, chat=body.turns(), tools=body.tool_chat())
    return {"prompt": gen.text}
