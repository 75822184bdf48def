"""LoRA adapters over HTTP: llama-server's ``GET /lora-adapters`` (a model's adapters, their ids and scales), and the
admin routes that load and unload adapters while the server runs: ``POST /admin/models/{name}/adapters`` and
``DELETE /admin/models/{name}/adapters/{adapter}``, and vLLM's ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (admin keys, see :mod:`llamafleet.api.middleware`).

An adapter loaded at runtime is checked before any replica sees it (a LoRA adapter GGUF of the model's architecture,
its name free and well formed), then loaded by every replica (:mod:`llamafleet.fleet.adapters`). Its memory is not
in the model's plan (the configured adapters are): it comes out of the margin the plan keeps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter
from pydantic import BaseModel, Field, ValidationError

from llamafleet.api.errors import ApiError
from llamafleet.api.protocol import Request
from llamafleet.api.service import Service, ServiceDep
from llamafleet.config_sections import LoraEntry
from llamafleet.fleet.adapters import adapters_of, set_adapters
from llamafleet.fleet.models import ManagedModel
from llamafleet.model.adapter import read_adapter_info
from llamafleet.model.header import GgufError, read_model_info
from llamafleet.model.hub import HubError, fetch, resolve
from llamafleet.model.hub_ref import RefError, is_ref, parse_ref

routes = APIRouter()


class AdapterCard(BaseModel):
    """An adapter as llama-server lists it (``id``, ``path``, ``scale``), with its name and what clients send."""

    id: int  # its position: the id of a request's lora entry
    name: str
    path: str
    scale: float  # when picked by name, or by id without a scale
    model: str  # the model name that picks it: MODEL:NAME


class LoadAdapter(Request):
    path: str = Field(min_length=1)  # a GGUF file on the server, or a hub reference hf:ORG/REPO/FILE.gguf
    name: str | None = None  # default: the file's stem
    scale: float = Field(1.0, allow_inf_nan=False)


class VllmLoad(Request):
    lora_name: str
    lora_path: str = Field(min_length=1)
    model: str | None = None  # which model (default: the first one); vLLM serves one
    load_inplace: bool = False  # replace an adapter of that name


class VllmUnload(Request):
    lora_name: str
    model: str | None = None
    lora_int_id: int | None = None  # vLLM's; the name decides here


def cards(m: ManagedModel) -> list[AdapterCard]:
    return [AdapterCard(id=i, name=a.name, path=a.path, scale=a.scale, model=f"{m.name}:{a.name}")
            for i, a in enumerate(adapters_of(m))]


@routes.get("/lora-adapters")
async def list_adapters(service: ServiceDep, model: str | None = None) -> list[AdapterCard]:
    """llama-server's list of the model's adapters (``?model=``: which model; default the first)."""
    return cards(service.find_model(model or service.model_name))


@routes.post("/admin/models/{name}/adapters")
async def load_adapter(name: str, body: LoadAdapter, service: ServiceDep) -> list[AdapterCard]:
    """Load an adapter onto every replica of the model (loading the model first if it is not); answers with the
    model's adapters."""
    return await _load(service, name, body.path, body.name, body.scale, replace=False)


@routes.delete("/admin/models/{name}/adapters/{adapter}")
async def unload_adapter(name: str, adapter: str, service: ServiceDep) -> list[AdapterCard]:
    """Unload an adapter: new requests that name it are refused at once; those running finish with it."""
    return _unload(service.find_model(name), adapter)


@routes.post("/v1/load_lora_adapter")
async def vllm_load(body: VllmLoad, service: ServiceDep) -> str:
    await _load(service, body.model or service.model_name, body.lora_path, body.lora_name, None,
                replace=body.load_inplace)
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@routes.post("/v1/unload_lora_adapter")
async def vllm_unload(body: VllmUnload, service: ServiceDep) -> str:
    _unload(service.find_model(body.model or service.model_name), body.lora_name)
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."


async def _load(service: Service, model: str, path: str, name: str | None, scale: float | None,
                replace: bool) -> list[AdapterCard]:
    m = (await service.for_model(model)).model
    if is_ref(path):
        try:
            path = str(await asyncio.to_thread(_fetched, path))
        except (RefError, HubError) as e:
            raise ApiError(400, f"invalid 'path': {e}", param="path") from None
    try:
        entry = LoraEntry.model_validate({"path": path, "name": name} | ({} if scale is None else {"scale": scale}))
    except ValidationError as e:
        raise ApiError(400, "; ".join(x["msg"].removeprefix("Value error, ") for x in e.errors()),
                       param="path") from None
    have = adapters_of(m)
    if not replace and entry.adapter_name in {a.name for a in have}:
        raise ApiError(409, f"model '{m.name}' already has an adapter '{entry.adapter_name}'; unload it first, or "
                            "give this one another name", code="adapter_exists")
    try:
        await asyncio.to_thread(read_adapter_info, entry.path, await asyncio.to_thread(_architecture, m))
    except (GgufError, OSError) as e:
        raise ApiError(422, f"{e}; give a LoRA adapter GGUF of this model", code="not_an_adapter",
                       param="path") from None
    set_adapters(m, (*(a for a in have if a.name != entry.adapter_name), entry.spec()))
    return cards(m)


def _unload(m: ManagedModel, adapter: str) -> list[AdapterCard]:
    have = adapters_of(m)
    if adapter not in {a.name for a in have}:
        raise ApiError(404, f"model '{m.name}' has no adapter '{adapter}'; its adapters: "
                            f"{', '.join(a.name for a in have) or 'none'}", code="adapter_not_found")
    if m.dispatcher is None:
        raise ApiError(409, f"model '{m.name}' is not loaded; its configured adapters load with it (edit its lora: "
                            "list to remove one)", code="model_not_loaded")
    set_adapters(m, tuple(a for a in have if a.name != adapter))
    return cards(m)


def _fetched(ref: str) -> Path:
    return fetch(resolve(parse_ref(ref)))


def _architecture(m: ManagedModel) -> str:
    """The architecture of the model ``m`` serves (its adapters must adapt the same); ``GgufError`` if it serves
    none here (remote members only, or the torch engine)."""
    if m.demand is not None and m.demand.model.engine == "llama.cpp":
        return m.demand.model.architecture
    engines = [s.engine for s in m.dispatcher.replicas.specs if s.engine is not None] if m.dispatcher else []
    if not engines or engines[0].engine != "llama.cpp":
        raise GgufError(f"model '{m.name}' loads no LoRA adapters here (they need the llama.cpp engine's replicas)")
    return read_model_info(engines[0].model_path).architecture
