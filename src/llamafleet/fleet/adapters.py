"""A model's LoRA adapters as the API process keeps them: the list its replicas load (configured under ``lora:``,
changed at runtime by the admin routes), and the adapter set a request asks for.

The list lives in the replicas' specs (:class:`~llamafleet.fleet.launch.ReplicaSpec`'s engine configuration), so a
replica that restarts loads the adapters of the moment; a change is sent to every running worker as
:class:`~llamafleet.fleet.messages.SetAdapters`, on the pipe its requests take, before any request names a new
adapter. Runtime changes last while the model stays loaded: a model loaded again starts from its configuration.

A request picks adapters two ways, as llama-server and vLLM clients do: the model name ``MODEL:ADAPTER`` (that adapter
at its configured scale) and llama-server's ``lora`` list of ``{id, scale}`` (``id`` an adapter's position in the list
or its name; the scale defaults to the configured one). With a ``lora`` list, the adapters it does not name are off,
as in llama-server, except the one the model name picks. A scale of 0 is the base model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from llamafleet.engine.types import LoraSpec, canonical_lora
from llamafleet.fleet.messages import SetAdapters
from llamafleet.fleet.models import ManagedModel


class UnknownAdapter(LookupError):
    """A request names an adapter the model does not have; the message lists those it has."""


def adapters_of(m: ManagedModel) -> tuple[LoraSpec, ...]:
    """The adapters ``m``'s replicas load now (its configuration's while it is not loaded)."""
    if m.dispatcher is not None:
        for spec in m.dispatcher.replicas.specs:
            if spec.engine is not None:
                return spec.engine.lora
        return ()
    if m.demand is not None:
        return tuple(e.spec() for e in m.demand.cfg.lora)
    return ()


def set_adapters(m: ManagedModel, adapters: tuple[LoraSpec, ...]) -> None:
    """Make ``adapters`` the loaded model ``m``'s: in its replicas' specs, and sent to its running workers."""
    assert m.dispatcher is not None, "the model must be loaded"
    replicas = m.dispatcher.replicas
    for i, spec in enumerate(replicas.specs):
        if spec.engine is not None:
            replicas.specs[i] = replace(spec, engine=replace(spec.engine, lora=adapters))
            replicas.send_running(i, SetAdapters(adapters))


def listing(adapters: Sequence[LoraSpec]) -> str:
    return ", ".join(f"{i}: '{a.name}'" for i, a in enumerate(adapters)) or "none"


def chosen(adapters: Sequence[LoraSpec], by_name: str | None,
           listed: Sequence[tuple[int | str, float | None]] | None) -> tuple[tuple[str, float], ...]:
    """The adapter set a request asks for (see the module's docstring): ``by_name`` from the model name, ``listed``
    the ``lora`` field's (id, scale) pairs. :class:`UnknownAdapter` naming an id the model does not have."""
    known = {a.name: a for a in adapters}
    picked: dict[str, float] = {}
    if by_name is not None:
        if by_name not in known:  # (unloaded since the name was looked up)
            raise UnknownAdapter(f"no adapter '{by_name}'; this model's adapters are {listing(adapters)}")
        picked[by_name] = known[by_name].scale
    for i, (key, scale) in enumerate(listed or ()):
        if isinstance(key, int):
            if not 0 <= key < len(adapters):
                raise UnknownAdapter(f"lora[{i}].id: no adapter {key}; this model's adapters are {listing(adapters)}")
            name = adapters[key].name
        elif key in known:
            name = key
        else:
            raise UnknownAdapter(f"lora[{i}].id: no adapter '{key}'; this model's adapters are {listing(adapters)}")
        picked[name] = known[name].scale if scale is None else scale
    return canonical_lora(picked.items())
