"""``GET /v1/usage``: what each API key used, per UTC day (admin keys only; see :mod:`llamafleet.tenants.usage`)."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter

from llamafleet.api.errors import ApiError
from llamafleet.api.service import ServiceDep

routes = APIRouter()


@routes.get("/v1/usage")
async def usage(service: ServiceDep, key: str | None = None, day: str | None = None) -> dict[str, Any]:
    """Rows of (key name, day): requests, prompt tokens (of them cached), completion tokens, refusals; ``key``: one
    key's name only; ``day``: one day (``YYYY-MM-DD``, UTC) only."""
    if day is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", day):
        raise ApiError(400, f"invalid 'day' {day[:40]!r}: give a UTC date as YYYY-MM-DD", param="day")
    if key is not None and key not in service.tenancy.ring.names() and not service.tenancy.usage.report(key):
        raise ApiError(404, f"no key is named '{key[:64]}' (GET /v1/usage lists every key's usage)", param="key")
    rows = [r for r in service.tenancy.usage.report(key) if day is None or r["day"] == day]
    return {"object": "list", "data": rows}
