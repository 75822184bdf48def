"""docs/API.md says what the code does: every parameter a route refuses as not built yet (its request's
``not_yet()`` list) is listed as refused in that route's section, and the words of each refusal name it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from llamafleet.api.anthropic_requests import CountTokensRequest, MessagesRequest
from llamafleet.api.errors import unsupported
from llamafleet.api.openai_requests import ChatCompletionRequest, CompletionRequest
from llamafleet.api.responses_requests import ResponsesRequest

API_MD = Path(__file__).resolve().parents[3] / "docs" / "API.md"

# each request type, and the heading of the docs/API.md section that describes its route
ROUTES: list[tuple[type[BaseModel], str]] = [
    (ChatCompletionRequest, "## `POST /v1/chat/completions` and `POST /v1/completions`"),
    (CompletionRequest, "## `POST /v1/chat/completions` and `POST /v1/completions`"),
    (ResponsesRequest, "## `POST /v1/responses`"),
    (MessagesRequest, "## `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic)"),
    (CountTokensRequest, "## `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic)"),
]


def section(heading: str) -> str:
    """The text of one ``## `` section of docs/API.md (its sub-sections included)."""
    text = API_MD.read_text(encoding="utf-8")
    assert heading in text, f"docs/API.md has no section {heading!r}"
    rest = text[text.index(heading) + len(heading):]
    end = re.search(r"^## ", rest, flags=re.MULTILINE)
    return rest[: end.start()] if end else rest


def refused(request: type[BaseModel]) -> list[str]:
    """The parameters whose use the request type refuses as not built yet: its ``not_yet()`` list."""
    return [param for param, _, _ in request.model_construct().not_yet()]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("request_type", "heading"), ROUTES, ids=[r.__name__ for r, _ in ROUTES])
def test_every_refused_parameter_is_documented_as_refused(request_type: type[BaseModel], heading: str) -> None:
    lines = section(heading).splitlines()
    missing = [p for p in refused(request_type)
               if not any(f"`{p}" in line and "refused" in line for line in lines)]
    assert not missing, f"docs/API.md, {heading}: say that these are refused: {missing}"


def test_the_rules_quote_a_refusal_this_server_really_gives() -> None:
    """The "Refused features" rule quotes a message: it must be the one a refused parameter gets."""
    rule = next(line for line in API_MD.read_text(encoding="utf-8").splitlines() if "is not supported yet:" in line)
    param = re.search(r"`'([\w.]+)' is not supported yet: \.\.\.`", rule)
    assert param, rule
    assert param.group(1) in {p for r, _ in ROUTES for p in refused(r)}
    assert unsupported(param.group(1), "x").message.startswith(f"'{param.group(1)}' is not supported yet: ")
