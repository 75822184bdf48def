"""The fleet's models as clients and operators see them: ``GET /v1/models`` (every configured model with its state
and placement, and the models being pulled with their download's progress), ``POST /admin/models/{name}/load`` /
``unload`` and ``POST /admin/models/pull`` (admin API keys only, see :mod:`llamafleet.api.middleware`)."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from llamafleet.api.errors import ApiError
from llamafleet.api.protocol import ModelCard
from llamafleet.api.pulls import Pull, PullRefused
from llamafleet.api.service import Service, ServiceDep
from llamafleet.fleet.adapters import adapters_of
from llamafleet.fleet.models import ModelUnavailable, NotUnloadable
from llamafleet.fleet.snapshot import ModelView
from llamafleet.model.header import GgufError
from llamafleet.model.hub import HubError, NoSpace, check_space, header, resolve
from llamafleet.model.hub_ref import RefError, model_stem, parse_ref

routes = APIRouter()


class Download(BaseModel):
    """A pull's progress, as a terminal's bar shows it."""

    ref: str
    bytes: int
    total: int
    bytes_per_s: float | None
    eta_s: float | None


class FleetModelCard(ModelCard):
    """OpenAI's model object, plus what llamafleet knows of it (clients that do not know these fields skip them)."""

    aliases: list[str]
    state: str  # loaded, loading, unloaded, unloading, failed; downloading while it is pulled from the hub
    pinned: bool
    where: list[str]  # where its replicas run (or are being loaded), e.g. ["GPU 0"]; empty when unloaded
    context_length: int  # per sequence
    waiting: int  # requests waiting for it to load
    load_progress: float | None = None  # while loading: the fraction of its replicas' weights loaded
    last_error: str | None = None
    download: Download | None = None  # while it is pulled from the hub (state "downloading")
    parent: str | None = None  # a LoRA adapter's card (id MODEL:ADAPTER): its base model, as vLLM lists adapters


class FleetModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FleetModelCard]


def card(service: Service, m: ModelView) -> FleetModelCard:
    return FleetModelCard(id=m.name, created=service.created, aliases=list(m.aliases), state=m.state, pinned=m.pinned,
                          where=list(m.where), context_length=m.n_ctx_per_seq, waiting=m.waiting,
                          load_progress=round(m.load_progress, 3) if m.state == "loading" else None,
                          last_error=m.last_error)


def adapter_cards(service: Service, m: ModelView) -> list[FleetModelCard]:
    """A card per LoRA adapter of ``m``, named ``MODEL:ADAPTER`` (what a plain OpenAI client sends to pick it)."""
    base = card(service, m)
    managed = service.models.find(m.name)
    return [base.model_copy(update={"id": f"{m.name}:{a.name}", "aliases": [], "parent": m.name})
            for a in (adapters_of(managed) if managed is not None else ())]


def pull_card(service: Service, p: Pull) -> FleetModelCard:
    return FleetModelCard(id=p.name, created=service.created, aliases=[], state=p.state, pinned=False, where=[],
                          context_length=0, waiting=0, last_error=p.error,
                          download=Download(ref=p.ref, bytes=int(p.done), total=p.total,
                                            bytes_per_s=None if p.rate is None else round(p.rate),
                                            eta_s=None if p.eta_s is None else round(p.eta_s, 1)))


@routes.get("/v1/models")
async def list_models(service: ServiceDep) -> FleetModelList:
    """Every configured model (those the request's key may use), and the models being pulled."""
    tenant = service.tenant
    return FleetModelList(data=[c for m in service.snapshot().models if tenant is None or tenant.may_use(m.name)
                                for c in (card(service, m), *adapter_cards(service, m))]
                          + [pull_card(service, p) for p in service.pulls.active.values()
                             if tenant is None or tenant.may_use(p.name)])


class PullRequest(BaseModel):
    model: str  # a hub reference, hf:ORG/REPO:QUANT
    name: str | None = Field(None, min_length=1)  # what clients will send as "model"; default: the file's stem


@routes.post("/admin/models/pull", status_code=202)
async def pull(body: PullRequest, service: ServiceDep) -> FleetModelCard:
    """Pull a model from the hub into ``models_dir`` (see :mod:`llamafleet.api.pulls`); answers once it is
    downloading, or refused before any download."""
    try:
        ref = parse_ref(body.model)
    except RefError as e:
        raise ApiError(400, str(e), code="invalid_model_reference", param="model") from None
    try:
        resolved = await asyncio.to_thread(resolve, ref)
        check_space(ref, sum(f.size for f in resolved.missing()))
        model = await asyncio.to_thread(header, resolved)
    except NoSpace as e:
        raise ApiError(507, str(e), code="insufficient_storage", param="model") from None
    except HubError as e:
        raise ApiError(502, str(e), code="hub_error", param="model") from None
    except GgufError as e:
        raise ApiError(422, f"{ref}: {e}", code="not_a_model", param="model") from None
    name = body.name or model_stem(resolved.files[0].name)
    try:
        p = service.pulls.start(service.models, resolved, model, name)
    except PullRefused as e:
        raise ApiError(e.status, str(e), code=e.code) from None
    return pull_card(service, p)


@routes.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, service: ServiceDep) -> FleetModelCard:
    m, adapter = service.find_choice(model_id)
    view = service.snapshot().model(m.name)
    return card(service, view) if adapter is None else next(c for c in adapter_cards(service, view)
                                                             if c.id.endswith(f":{adapter}"))


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
