"""What the HTTP handlers share: the served model's name and limits, and the dispatcher to submit work to.

One :class:`Service` lives on the FastAPI app (``app.state.service``); handlers get it with
``Depends(get_service)``. It turns "no replica can take this" into a 503 and a wrong model name into a 404 with the
OpenAI error body, so every route words those the same way.
"""

from __future__ import annotations

import time
from typing import Annotated, cast

from fastapi import Depends, Request

from llamafleet.dispatch import Dispatcher, Group
from llamafleet.messages import Submit
from llamafleet.protocol import ApiError
from llamafleet.router import NoReplicaError


class Service:
    """The served model and the way to it."""

    def __init__(self, dispatcher: Dispatcher, model_name: str, n_ctx_per_seq: int) -> None:
        self.dispatcher = dispatcher
        self.model_name = model_name
        self.n_ctx_per_seq = n_ctx_per_seq
        self.created = int(time.time())
        self.loaded = False  # set once the first load of every replica finished

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(404, f"model '{name}' is not served here; this server serves '{self.model_name}' "
                                "(see GET /v1/models)", param="model", code="model_not_found")

    def submit(self, msgs: list[Submit]) -> Group:
        try:
            return self.dispatcher.submit(msgs)
        except NoReplicaError as e:
            raise ApiError(503, f"{e}; retry shortly (GET /ready reports when replicas are up)",
                           code="service_unavailable") from None


def get_service(request: Request) -> Service:
    return cast(Service, request.app.state.service)


ServiceDep = Annotated[Service, Depends(get_service)]
