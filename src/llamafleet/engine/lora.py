"""LoRA adapters in the engine: loaded once per replica, chosen per request, grouped per step.

llama.cpp applies adapters per context, not per sequence (:mod:`llamafleet.engine.llama_lora`): every sequence of one
``llama_decode`` runs with the adapters set on the context at that moment. So a step whose sequences ask for
different adapter sets is cut into one decode per set (:meth:`Adapters.groups`), the context's adapters set before
each (:meth:`Adapters.apply`). What keeps that cheap:

* a step whose sequences all share one set (the common case: no adapters at all) is one decode, as without LoRA;
* the set already on the context decodes first, so a step of two sets switches once, and the next step, starting
  with the set the last one left, switches once again (never twice);
* a set is only handed to llama.cpp when it differs from the one on the context (a change makes llama.cpp reserve
  its compute buffers again at the next decode);
* a scale of 0 is no adapter (llama.cpp leaves it out): such a request decodes with the base model's group.

A request names its adapters with their scales (:attr:`~llamafleet.engine.types.SamplingParams.lora`); they are
resolved to the loaded adapters when it is admitted. :meth:`Adapters.sync` makes the loaded adapters a new list
(runtime loads and unloads): one unloaded while requests that name it wait or run stays loaded until they are done.
A sequence with adapters neither reuses another's KV nor offers its own (its keys and values differ from the base
model's), see the engine's admission.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar

from llamafleet.engine.llama import Context, Model
from llamafleet.engine.llama_lora import LoraAdapter, set_adapters
from llamafleet.engine.types import LoraSpec, canonical_lora

if TYPE_CHECKING:
    from llamafleet.engine.sequence import Sequence
    from llamafleet.engine.types import Request

Applied = tuple[tuple[LoraAdapter, float], ...]  # adapters with their scales, as a sequence decodes with them
T = TypeVar("T")


class Adapters:
    """The LoRA adapters loaded onto one model, by name; :meth:`close` frees them."""

    def __init__(self, model: Model, specs: Iterable[LoraSpec] = ()) -> None:
        self._model = model
        self._loaded: dict[str, tuple[LoraSpec, LoraAdapter]] = {}
        self._retired: dict[str, list[LoraAdapter]] = {}  # unloaded, kept while a request still names them
        self.current: Applied = ()  # what the context decodes with now
        self.switches = 0  # adapter sets handed to llama.cpp
        try:
            self.sync(specs)
        except BaseException:
            self.close()
            raise

    def sync(self, specs: Iterable[LoraSpec]) -> None:
        """Make ``specs`` the loaded adapters: new ones loaded, those no longer listed retired, those listed with
        another file loaded again. ``ValueError`` naming those llama.cpp refused (the others are loaded)."""
        wanted = {s.name: s for s in specs}
        for name, (spec, adapter) in list(self._loaded.items()):
            if name not in wanted or wanted[name].path != spec.path:
                del self._loaded[name]
                self._retired.setdefault(name, []).append(adapter)
        refused = []
        for name, spec in wanted.items():
            if name not in self._loaded:
                try:
                    self._loaded[name] = (spec, LoraAdapter(self._model, spec.path))
                except ValueError as e:
                    refused.append(str(e))
        if refused:
            raise ValueError("; ".join(refused))

    def check(self, chosen: tuple[tuple[str, float], ...]) -> None:
        """``ValueError`` naming an adapter this model does not have."""
        for name, _ in chosen:
            if name not in self._loaded:
                have = ", ".join(self._loaded) or "none"
                raise ValueError(f"no LoRA adapter '{name}' is loaded on this model (loaded: {have})")

    def resolve(self, chosen: tuple[tuple[str, float], ...]) -> Applied:
        """The loaded adapters ``chosen`` names (one retired since the request was checked still serves it)."""
        return tuple((self._find(name), scale) for name, scale in canonical_lora(chosen))

    def _find(self, name: str) -> LoraAdapter:
        if name in self._loaded:
            return self._loaded[name][1]
        return self._retired[name][-1]

    def groups(self, plan: list[tuple[Sequence, T]]) -> list[tuple[Applied, list[tuple[Sequence, T]]]]:
        """``plan`` cut into one part per adapter set, in plan order within each; the set on the context first."""
        parts: dict[Applied, list[tuple[Sequence, T]]] = {}
        for entry in plan:
            parts.setdefault(entry[0].lora, []).append(entry)
        if len(parts) == 1:
            return list(parts.items())
        first = [(self.current, parts.pop(self.current))] if self.current in parts else []
        return first + list(parts.items())

    def apply(self, ctx: Context, adapters: Applied) -> None:
        """Make ``adapters`` the context's from its next decode on, unless they already are."""
        if adapters != self.current:
            set_adapters(ctx, adapters)
            self.current = adapters
            self.switches += 1

    def reap(self, ctx: Context, running: Iterable[Sequence], waiting: Iterable[Request]) -> None:
        """Free the retired adapters no running sequence holds and no waiting request names (call between passes)."""
        if not self._retired:
            return
        held = {id(a) for s in running for a, _ in s.lora}
        named = {name for r in waiting for name, _ in r.params.lora}
        for name, adapters in list(self._retired.items()):
            keep = [a for a in adapters if id(a) in held or (name in named and a is adapters[-1])]
            for a in adapters:
                if a not in keep:
                    if any(a is b for b, _ in self.current):
                        self.apply(ctx, ())
                    a.close()
            if keep:
                self._retired[name] = keep
            else:
                del self._retired[name]

    def close(self) -> None:
        for _, adapter in self._loaded.values():
            adapter.close()
        for adapters in self._retired.values():
            for a in adapters:
                a.close()
        self._loaded.clear()
        self._retired.clear()
