"""The models one server serves, each with its own effective configuration.

A fleet names its models one of three ways: the single-model keys (``model_path``, ``model_name``: the original
service's, unchanged), a ``models:`` list, or ``models_dir`` (every ``.gguf`` in a folder under its file stem; with a
``models:`` list, the folder adds the files the list does not name). :func:`served_models` turns any of them into
one list of :class:`ServedModel`, each carrying a whole :class:`FleetConfig` for its model: the fleet's keys with
the entry's own knobs on top. Keys the user did not set stay unset, so the planner's auto-fit still applies per
model. With several models, ``replicas: auto`` means one replica (each model leaves room for the others); a lone
model keeps the planner's choice (one per GPU that holds it). A model's path may be a hub reference
(``hf:ORG/REPO:QUANT``): it is resolved here to the file it will be in the hub cache, and its header is read from the
hub (:mod:`llamafleet.model.hub`) until the caller fetches it, once the placement fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from llamafleet.config import ConfigError, FleetConfig, ModelEntry, describe_errors
from llamafleet.config_sections import RemoteEntry
from llamafleet.model.hub_ref import model_stem, split_parts

if TYPE_CHECKING:
    from llamafleet.model.hub import Resolved
    from llamafleet.placement.packing import Demand

FLEET_ONLY = {"models", "models_dir", "model_path", "model_name", "replicas", "remote"}


@dataclass(frozen=True)
class ServedModel:
    """One model of the fleet: the names clients may send, its file, how it is kept, its configuration."""

    name: str
    path: Path | None  # None: served by its remote members only
    aliases: tuple[str, ...]
    pinned: bool  # loaded at start, never evicted (a lone model always is)
    idle_ttl_s: float | None  # unloaded after this long idle; None = kept until evicted
    cfg: FleetConfig
    remote: tuple[RemoteEntry, ...] = ()  # remote members beside its local replicas
    hub: Resolved | None = None  # a model on the hub: ``path`` is where it will be in the cache once fetched

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def served_models(cfg: FleetConfig, default_path: Callable[[], Path]) -> list[ServedModel]:
    """The fleet's models in configuration order (``default_path`` gives the demo model when none is named)."""
    if cfg.models is None and cfg.models_dir is None:
        path, hub = _located(cfg.model_path, "model_path (--model)") if cfg.model_path else (default_path(), None)
        return [ServedModel(cfg.served_name(path), path, (), True, None, cfg, hub=hub)]
    entries = list(cfg.models or ())
    if cfg.models_dir is not None:
        entries += _folder_entries(Path(cfg.models_dir), entries)
    if not entries:
        raise ConfigError("models: the list is empty; name at least one model (name and path)")
    return [_served(cfg, e, several=len(entries) > 1) for e in entries]


def _folder_entries(folder: Path, listed: list[ModelEntry]) -> list[ModelEntry]:
    if not folder.is_dir():
        raise ConfigError(f"models_dir: {folder} is not a folder; give a folder of .gguf files (--models-dir)")
    taken = {n for e in listed for n in (e.name, *e.aliases)} | {str(Path(e.path).resolve()) for e in listed if e.path}
    files = [f for f in sorted(folder.glob("*.gguf")) if _first_part(f.name)]
    if not files and not listed:
        raise ConfigError(f"models_dir: {folder} holds no .gguf file")
    fresh = [f for f in files if model_stem(f.name) not in taken and str(f.resolve()) not in taken]
    return [ModelEntry.model_validate({"name": model_stem(f.name), "path": str(f)}) for f in fresh]


def _first_part(name: str) -> bool:
    """Whether a file is a model to serve: a whole one, or a split model's first part (llama.cpp loads the rest)."""
    parts = split_parts(name)
    return parts is None or parts[1] == 1


def folder_model(fleet: FleetConfig, name: str, path: Path) -> ServedModel:
    """A model added to ``models_dir`` while the fleet runs (a pull), as a file found there at start would be."""
    return _served(fleet, ModelEntry.model_validate({"name": name, "path": str(path)}), several=True)


def _served(fleet: FleetConfig, entry: ModelEntry, several: bool) -> ServedModel:
    data = fleet.model_dump(exclude_unset=True, exclude=FLEET_ONLY)
    data |= entry.knobs | {"model_path": entry.path, "model_name": entry.name}
    if entry.replicas != "auto":
        data["replicas"] = entry.replicas
    elif several:
        data["replicas"] = 1
    elif fleet.replicas is not None:
        data["replicas"] = fleet.replicas
    try:
        cfg = fetched_extras(FleetConfig.model_validate(data))
    except ValidationError as e:
        raise ConfigError(describe_errors(e, f"invalid settings for model '{entry.name}':")) from None
    ttl = entry.idle_ttl_s if entry.idle_ttl_s is not None else fleet.idle_ttl_s
    if entry.path is None:  # nothing is loaded here: always "loaded", never evicted
        return ServedModel(entry.name, None, tuple(entry.aliases), True, None, cfg, tuple(entry.remote))
    path, hub = _located(entry.path, f"models[{entry.name}].path")
    return ServedModel(entry.name, path, tuple(entry.aliases), entry.pinned or not several, ttl, cfg,
                       tuple(entry.remote), hub)


def fetched_extras(cfg: FleetConfig) -> FleetConfig:
    """``cfg`` with a speculative draft model and LoRA adapters named on the hub fetched now and named by their files
    (the planner and the workers read those files; drafts and adapters are small). Raises ``HubError``."""
    from llamafleet.model.hub import fetch

    source = cfg.speculative.draft_model
    if source is not None and (hub := _located(source, "speculative.draft_model")[1]) is not None:
        fetch(hub)
        cfg = cfg.model_copy(update={"speculative": cfg.speculative.model_copy(update={"draft_model": str(hub.path)})})
    adapters = []
    for i, entry in enumerate(cfg.lora):
        if (hub := _located(entry.path, f"lora[{i}].path")[1]) is not None:
            fetch(hub)
            entry = entry.model_copy(update={"path": str(hub.path), "name": entry.adapter_name})
        adapters.append(entry)
    return cfg.model_copy(update={"lora": adapters}) if adapters else cfg


def _located(source: str, key: str) -> tuple[Path, Resolved | None]:
    """A model's file: the path given, or a hub reference resolved (files, commit; nothing downloaded yet) and the
    path it will have in the hub cache. Raises ``HubError`` if the hub cannot say."""
    from llamafleet.model.hub import resolve
    from llamafleet.model.hub_ref import RefError, is_ref, parse_ref

    if not is_ref(source):
        return Path(source), None
    try:
        ref = parse_ref(source)
    except RefError as e:
        raise ConfigError(f"{key}: {e}") from None
    hub = resolve(ref)
    return hub.path, hub


def demands(served: list[ServedModel]) -> list[Demand]:
    """What the packer needs of each model with a file: its header read from it, or from the hub for a model not
    fetched yet (raises ``GgufError``, ``HubError``)."""
    from llamafleet.model.checkpoint import describe
    from llamafleet.model.hub import header
    from llamafleet.placement.packing import Demand

    return [Demand(m.name, header(m.hub) if m.hub else describe(m.path), m.cfg, m.pinned)
            for m in served if m.path is not None]
