"""The fleet's models as clients and operators see them: ``GET /v1/models`` (every configured model with its state
and placement) and ``POST /admin/models/{name}/load`` / ``unload`` (admin API keys only, see
:mod:`llamafleet.api.middleware`)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel

from llamafleet.api.errors import ApiError
from llamafleet.api.protocol import ModelCard
from llamafleet.api.service import Service, ServiceDep
from llamafleet.fleet.models import ModelUnavailable, NotUnloadable
from llamafleet.fleet.snapshot import ModelView

routes = APIRouter()


class FleetModelCard(ModelCard):
    """OpenAI's model object, plus what llamafleet knows of it (clients that do not know these fields skip them)."""

    aliases: list[str]
    state: str  # loaded, loading, unloaded, unloading, failed
    pinned: bool
    where: list[str]  # where its replicas run (or are being loaded), e.g. ["GPU 0"]; empty when unloaded
    context_length: int  # per sequence
    waiting: int  # requests waiting for it to load
    load_progress: float | None = None  # while loading: the fraction of its replicas' weights loaded
    last_error: str | None = None


class FleetModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FleetModelCard]


def card(service: Service, m: ModelView) -> FleetModelCard:
    return FleetModelCard(id=m.name, created=service.created, aliases=list(m.aliases), state=m.state, pinned=m.pinned,
                          where=list(m.where), context_length=m.n_ctx_per_seq, waiting=m.waiting,
                          load_progress=round(m.load_progress, 3) if m.state == "loading" else None,
                          last_error=m.last_error)


@routes.get("/v1/models")
async def list_models(service: ServiceDep) -> FleetModelList:
    """Every configured model (those the request's key may use)."""
    tenant = service.tenant
    return FleetModelList(data=[card(service, m) for m in service.snapshot().models
                                if tenant is None or tenant.may_use(m.name)])


@routes.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, service: ServiceDep) -> FleetModelCard:
    return card(service, service.snapshot().model(service.find_model(model_id).name))


@routes.post("/admin/models/{name}/load")
async def load(name: str, service: ServiceDep) -> FleetModelCard:
    """Load the model now (evicting least recently used ones if placement says so); answers once it is loaded."""
    m = service.find_model(name)
    try:
        await service.models.load(m)
    except ModelUnavailable as e:
        raise ApiError(503, str(e), code="service_unavailable") from None
    return card(service, service.snapshot().model(m.name))


@routes.post("/admin/models/{name}/unload")
async def unload(name: str, service: ServiceDep) -> FleetModelCard:
    """Unload the model once its running requests finish; a pinned model is refused (409)."""
    m = service.find_model(name)
    try:
        await service.models.unload(m)
    except NotUnloadable as e:
        raise ApiError(409, str(e), code="model_pinned") from None
    return card(service, service.snapshot().model(m.name))
