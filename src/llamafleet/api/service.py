"""What the HTTP handlers share: the served model's name and limits, and the dispatcher to submit work to.

One :class:`Service` lives on the FastAPI app (``app.state.service``); handlers get it with
``Depends(get_service)``. Everything that refuses work before it is queued lives in :meth:`Service.submit`, so every
route words it the same way: a wrong model name (404), ``max_tokens`` that cannot fit the context (400 with the
numbers), no replica up or GPU memory above the refuse watermark (503), full queues (429); 503 and 429 carry
``Retry-After``.
"""

from __future__ import annotations

import time
from typing import Annotated, cast

from fastapi import Depends, Request

from llamafleet.api.errors import ApiError
from llamafleet.config import FleetConfig
from llamafleet.fleet.dispatch import Dispatcher, Group
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.router import NoReplicaError, QueueFullError
from llamafleet.fleet.telemetry import FleetMetrics, GpuSample
from llamafleet.placement.plan import Plan

RETRY_AFTER_S = 1  # what 429 and 503 answers suggest; queues move within a few engine steps


class Service:
    """The served model, the way to it, and the limits on the way in."""

    def __init__(self, dispatcher: Dispatcher, model_name: str, n_ctx_per_seq: int,
                 config: FleetConfig | None = None, api_keys: frozenset[str] = frozenset(),
                 plan: Plan | None = None) -> None:
        self.dispatcher = dispatcher
        self.model_name = model_name
        self.n_ctx_per_seq = n_ctx_per_seq
        self.config = config or FleetConfig.model_validate({})
        self.api_keys = api_keys  # empty: no authentication
        self.plan = plan  # where the replicas were placed and why (for the status page); None: not planned here
        self.created = int(time.time())
        self.loaded = False  # set once the first load of every replica finished
        self.overloaded: str | None = None  # set by the watchdog: why new work is refused (GPU memory)
        self.gpus: list[GpuSample] = []  # the watchdog's latest GPU samples

    @property
    def readiness(self) -> str:
        """``loading`` (first load), ``overloaded`` (GPU memory), ``ready`` (every replica), ``degraded`` (some
        replica serves), ``down`` (none does)."""
        serving = any(r.status == "ready" for r in self.dispatcher.replicas.states)
        return ("loading" if not self.loaded else "overloaded" if self.overloaded is not None
                else "ready" if self.dispatcher.replicas.all_ready else "degraded" if serving else "down")

    @property
    def metrics(self) -> FleetMetrics:
        return self.dispatcher.metrics

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(404, f"model '{name}' is not served here; this server serves '{self.model_name}' "
                                "(see GET /v1/models)", param="model", code="model_not_found")

    def submit(self, msgs: list[Submit]) -> Group:
        for m in msgs:
            if m.params.max_tokens is not None and m.params.max_tokens >= self.n_ctx_per_seq:
                raise ApiError(400, f"max_tokens ({m.params.max_tokens}) leaves no room for a prompt in the context "
                                    f"per sequence ({self.n_ctx_per_seq}); lower max_tokens", param="max_tokens")
        if self.overloaded is not None:
            raise self._refuse(503, "overloaded", f"the server is refusing new work: {self.overloaded}; retry shortly")
        try:
            return self.dispatcher.submit(msgs, self.config.request_timeout_s)
        except NoReplicaError as e:
            raise self._refuse(503, "no_replica",
                               f"{e}; retry shortly (GET /ready reports when replicas are up)") from None
        except QueueFullError as e:
            raise self._refuse(429, "queue_full", f"{e}; retry after {RETRY_AFTER_S}s") from None

    def _refuse(self, status: int, reason: str, message: str) -> ApiError:
        self.metrics.refused.inc(reason)
        code = "rate_limit_exceeded" if status == 429 else "service_unavailable"
        return ApiError(status, message, code=code, headers={"Retry-After": str(RETRY_AFTER_S)})


def get_service(request: Request) -> Service:
    return cast(Service, request.app.state.service)


ServiceDep = Annotated[Service, Depends(get_service)]
