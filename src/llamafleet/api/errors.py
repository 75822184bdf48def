"""Error answers: :class:`ApiError` (raised anywhere in the API process) and the bodies it becomes, in the dialect of
the route that failed.

OpenAI's body (``{"error": {"message", "type", "param", "code"}}``) is the default; the Anthropic routes
(``/v1/messages...``) answer with Anthropic's (``{"type": "error", "error": {"type", "message"}}``), so that each
SDK raises its own typed exceptions. :func:`error_response` picks the dialect from the request path, which is known
even where no route has run yet (a 401 or 413 from the gate, a request that fails validation).
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse

SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair: JSON can carry one, UTF-8 cannot
ANTHROPIC_PATHS = "/v1/messages"  # the prefix of every route that speaks Anthropic's dialect

log = logging.getLogger(__name__)

_ANTHROPIC_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                    408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error", 504: "timeout_error"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """Raised by handlers; becomes an error body with ``status`` (and ``headers``, e.g. ``Retry-After``)."""

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
        which no UTF-8 body can carry: they become U+FFFD here and in :meth:`anthropic_body`, the places every error
        body passes."""
        param = None if self.param is None else utf8_safe(self.param)
        return ErrorResponse(error=ErrorDetail(message=utf8_safe(self.message), type=error_type(self.status),
                                               param=param, code=self.code))

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's error body (also the data of its stream's ``error`` event)."""
        kind = _ANTHROPIC_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": utf8_safe(self.message)}}


def is_anthropic(path: str) -> bool:
    return path.startswith(ANTHROPIC_PATHS)


def error_response(exc: ApiError, path: str = "") -> JSONResponse:
    """The HTTP response of ``exc`` for a request to ``path``: its error body, status and headers."""
    body = exc.anthropic_body() if is_anthropic(path) else exc.body().model_dump()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


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


NotYet = list[tuple[str, bool, str]]  # (parameter, whether the request uses it, what to do instead)


def unsupported(param: str, what: str) -> ApiError:
    """The 400 for a parameter this server knows but cannot honour yet: it names the parameter and what to do."""
    return ApiError(400, f"'{param}' is not supported yet: {what}", param=param, code="unsupported_parameter")


def refuse_unbuilt(not_yet: NotYet) -> None:
    """Raise the 400 of the first parameter in a request's ``not_yet()`` list that the request uses."""
    for param, used, what in not_yet:
        if used:
            raise unsupported(param, what)
