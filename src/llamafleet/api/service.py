"""What the HTTP handlers share: the served models, their limits, and the way to each model's replicas.

One :class:`Service` lives on the FastAPI app (``app.state.service``); handlers get it with
``Depends(get_service)`` and, for a request that names a model, ``await service.for_model(name)``: a view of the
same service bound to that model (loaded first if it is not, see :mod:`llamafleet.fleet.models`). Everything that
refuses work before it is queued lives in :meth:`Service.for_model` and :meth:`Service.submit`, so every route words
it the same way: a wrong model or adapter name (404; a model name ``MODEL:ADAPTER`` picks a LoRA adapter, and a
request's own ``lora`` list more: :mod:`llamafleet.fleet.adapters`), ``max_tokens`` that cannot fit the context (400
with the numbers), a model
that cannot load now, no replica up or GPU memory above the refuse watermark (503), full queues (429); 503 and 429
carry ``Retry-After``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Annotated, cast

from fastapi import Depends, Request

from llamafleet.api.errors import ApiError
from llamafleet.api.llama_fields import LoraChoice
from llamafleet.api.middleware import tenant_of
from llamafleet.api.pulls import Pulls
from llamafleet.api.response_store import ResponseStore
from llamafleet.api.tools import Serving
from llamafleet.config import FleetConfig
from llamafleet.engine.families import FAMILIES, Family
from llamafleet.engine.types import DEFAULT_PRIORITY
from llamafleet.fleet.adapters import UnknownAdapter, adapters_of, chosen
from llamafleet.fleet.dispatch import Group, Unservable
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.models import LOAD_RETRY_S, ManagedModel, ModelManager, ModelUnavailable
from llamafleet.fleet.router import NoReplicaError, QueueFullError
from llamafleet.fleet.snapshot import FleetSnapshot, take
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.fleet.watchdog import Watchdog
from llamafleet.tenants.keys import KeyRing, Tenant, effective_priority
from llamafleet.tenants.tenancy import Tenancy

RETRY_AFTER_S = 1  # what 429 and 503 answers suggest; queues move within a few engine steps


@dataclass
class _Shared:
    """What every view of one service shares: configuration, keys, models, and their watchdog."""

    config: FleetConfig
    models: ModelManager
    tenancy: Tenancy
    created: int = field(default_factory=lambda: int(time.time()))
    loaded: bool = False  # set once the first load of every pinned model finished
    watchdog: Watchdog = field(init=False)  # GPU memory and slot leaks (run by the app while it serves)
    responses: ResponseStore = field(init=False)  # stored responses, for previous_response_id
    pulls: Pulls = field(default_factory=Pulls)  # models on their way from the hub (POST /admin/models/pull)

    def __post_init__(self) -> None:
        c = self.config
        self.watchdog = Watchdog(self.models, c)
        self.responses = ResponseStore(c.responses_store_max, c.responses_store_mib << 20, c.responses_ttl_s)


class Service:
    """The served models, the way to them, and the limits on the way in; bound to one model (the first configured
    one, unless :meth:`for_model` gave this view)."""

    tenant: Tenant | None = None  # whose request this view serves (None: authentication is off)
    lora: tuple[tuple[str, float], ...] = ()  # the LoRA adapters its requests decode with (none: the base model)
    adapter: str | None = None  # the adapter its model name picked (MODEL:ADAPTER), which answers name

    def __init__(self, models: ModelManager, keys: KeyRing | None = None,
                 keys_files: tuple[str | None, str | None] | None = None) -> None:
        """A service of ``models`` (one pinned model, or several), configured as the manager is, accepting ``keys``
        (reloaded from ``keys_files``, see :class:`~llamafleet.tenants.tenancy.Tenancy`)."""
        tenancy = Tenancy(keys or KeyRing(), models.metrics, keys_files)
        self._shared = _Shared(models.cfg, models, tenancy)
        self.model = models.models[0]

    # -- what every view shares ----------------------------------------------------------------------------------
    @property
    def config(self) -> FleetConfig:
        return self._shared.config

    @property
    def tenancy(self) -> Tenancy:
        return self._shared.tenancy

    @property
    def models(self) -> ModelManager:
        return self._shared.models

    @property
    def responses(self) -> ResponseStore:
        return self._shared.responses

    @property
    def pulls(self) -> Pulls:
        return self._shared.pulls

    @property
    def metrics(self) -> FleetMetrics:
        return self._shared.models.metrics

    @property
    def created(self) -> int:
        return self._shared.created

    @property
    def loaded(self) -> bool:
        return self._shared.loaded

    @loaded.setter
    def loaded(self, value: bool) -> None:
        self._shared.loaded = value

    @property
    def watchdog(self) -> Watchdog:
        return self._shared.watchdog

    @property
    def overloaded(self) -> str | None:
        """Why the watchdog refuses new work (GPU memory), or None."""
        return self._shared.watchdog.overloaded

    # -- the bound model -----------------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The bound model's name, as answers give it (``MODEL:ADAPTER`` when the request picked an adapter so)."""
        return self.model.name if self.adapter is None else f"{self.model.name}:{self.adapter}"

    @property
    def n_ctx_per_seq(self) -> int:
        return self.model.n_ctx_per_seq

    @property
    def family(self) -> Family | None:
        """The bound model's family, as its replicas recognised it from its template (None: the generic path)."""
        name = None if self.model.dispatcher is None else self.model.dispatcher.family
        return None if name is None else FAMILIES.get(name)

    @property
    def model_serving(self) -> Serving:
        """What a chat request needs to know of the bound model (see :class:`~llamafleet.api.tools.ToolRequest`)."""
        return Serving(self.family, self.config.reasoning_budget, tuple(self.config.chat_template_kwargs.items()),
                       self.n_ctx_per_seq)

    def for_tenant(self, tenant: Tenant | None) -> Service:
        """This service serving ``tenant``'s request."""
        if tenant is None:
            return self
        view = Service.__new__(Service)
        view._shared, view.model, view.tenant = self._shared, self.model, tenant
        return view

    def find_model(self, name: str) -> ManagedModel:
        """The configured model ``name`` names (or an alias of it, or ``MODEL:ADAPTER``); 404 if none, or if the
        tenant may not use it."""
        return self.find_choice(name)[0]

    def find_choice(self, name: str) -> tuple[ManagedModel, str | None]:
        """:meth:`find_model`, and the LoRA adapter a name ``MODEL:ADAPTER`` picks (404 naming one it lacks)."""
        model, adapter = self.models.find(name), None
        if model is None and ":" in name:
            base, _, adapter = name.rpartition(":")
            model = self.models.find(base)
            if model is not None and adapter not in (have := [a.name for a in adapters_of(model)]):
                raise ApiError(404, f"model '{base}' has no LoRA adapter '{adapter}'; its adapters: "
                                    f"{', '.join(have) or 'none'} (see GET /v1/models)", param="model",
                               code="model_not_found")
        tenant = self.tenant
        if model is None or (tenant is not None and not tenant.may_use(model.name)):
            if model is not None and tenant is not None:
                self.tenancy.usage.refusal(tenant.name, "model")
            served = ", ".join(f"'{m.name}'" for m in self.models.models if tenant is None or tenant.may_use(m.name))
            raise ApiError(404, f"model '{name}' is not served here; this server serves {served} "
                                "(see GET /v1/models)", param="model", code="model_not_found")
        return model, adapter

    async def for_model(self, name: str, lora: list[LoraChoice] | None = None) -> Service:
        """This service bound to the model ``name``, once it is loaded (see :meth:`ModelManager.acquire`), with the
        LoRA adapters its name and ``lora`` (llama-server's field) pick (400 naming one the model lacks)."""
        model, adapter = self.find_choice(name)
        try:
            await self.models.acquire(model)
        except ModelUnavailable as e:
            raise self._refuse(503, "model_unavailable", str(e), LOAD_RETRY_S) from None
        view = Service.__new__(Service)
        view._shared, view.model, view.tenant = self._shared, model, self.tenant
        view.adapter = adapter
        if adapter is not None or lora:
            try:
                view.lora = chosen(adapters_of(model), adapter, [c.pair for c in lora or ()])
            except UnknownAdapter as e:
                raise ApiError(400, str(e), param="lora" if lora else "model") from None
        return view

    def submit(self, msgs: list[Submit], priority: int | None = None) -> Group:
        """Queue ``msgs`` (one request's sequences) at the tenant's priority, or the lower ``priority`` the request
        asks for (:func:`~llamafleet.tenants.keys.effective_priority`)."""
        for m in msgs:
            if m.params.max_tokens is not None and m.params.max_tokens >= self.n_ctx_per_seq:
                raise ApiError(400, f"max_tokens ({m.params.max_tokens}) leaves no room for a prompt in the context "
                                    f"per sequence ({self.n_ctx_per_seq}); lower max_tokens", param="max_tokens")
        if self.overloaded is not None:
            raise self._refuse(503, "overloaded", f"the server is refusing new work: {self.overloaded}; retry shortly")
        if self.lora:
            if any(m.embed is not None or m.rerank is not None for m in msgs):
                raise ApiError(400, f"model '{self.model_name}': LoRA adapters apply to generated text, not to "
                                    f"embeddings or scores; send the model '{self.model.name}'", param="model")
            msgs = [replace(m, params=replace(m.params, lora=self.lora)) for m in msgs]
        dispatcher = self.model.dispatcher
        try:
            if dispatcher is None or self.model.state == "unloading":
                raise NoReplicaError(f"model '{self.model_name}' is {self.model.state}")
            tenant = self.tenant
            scheduled = tenant is not None and not tenant.plain  # a plain key is scheduled as before tenants
            level = effective_priority(tenant.priority if tenant is not None and scheduled else None, priority)
            if scheduled or level != DEFAULT_PRIORITY:
                msgs = [replace(m, priority=level, tenant=tenant.name if tenant and scheduled else "") for m in msgs]
            meter = None if tenant is None else self.tenancy.meter(tenant)
            return dispatcher.submit(msgs, self.config.request_timeout_s, meter)
        except NoReplicaError as e:
            raise self._refuse(503, "no_replica",
                               f"{e}; retry shortly (GET /ready reports when replicas are up)") from None
        except Unservable as e:
            raise ApiError(400, str(e)) from None
        except QueueFullError as e:
            raise self._refuse(429, "queue_full", f"{e}; retry after {RETRY_AFTER_S}s") from None

    def _refuse(self, status: int, reason: str, message: str, retry_after_s: int = RETRY_AFTER_S) -> ApiError:
        self.metrics.refused.inc(reason)
        code = "rate_limit_exceeded" if status == 429 else "service_unavailable"
        return ApiError(status, message, code=code, headers={"Retry-After": str(retry_after_s)})

    # -- the whole fleet, for probes, metrics and status ---------------------------------------------------------
    def snapshot(self) -> FleetSnapshot:
        """Every model and replica now, the GPUs as the watchdog last saw them (:mod:`llamafleet.fleet.snapshot`)."""
        return take(self.models, self.watchdog.gpus, self.overloaded)


def get_service(request: Request) -> Service:
    """The server's service, serving the tenant whose key the request carried."""
    return cast(Service, request.app.state.service).for_tenant(tenant_of(request.scope))


ServiceDep = Annotated[Service, Depends(get_service)]
