"""The models one server serves, each with its own effective configuration.

A fleet names its models one of three ways: the single-model keys (``model_path``, ``model_name``: the original
service's, unchanged), a ``models:`` list, or ``models_dir`` (every ``.gguf`` in a folder under its file stem; with a
``models:`` list, the folder adds the files the list does not name). :func:`served_models` turns any of them into
one list of :class:`ServedModel`, each carrying a whole :class:`FleetConfig` for its model: the fleet's keys with
the entry's own knobs on top. Keys the user did not set stay unset, so the planner's auto-fit still applies per
model. With several models, ``replicas: auto`` means one replica (each model leaves room for the others); a lone
model keeps the planner's choice (one per GPU that holds it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from llamafleet.config import ConfigError, FleetConfig, ModelEntry, describe_errors
from llamafleet.config_sections import RemoteEntry

if TYPE_CHECKING:
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

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def served_models(cfg: FleetConfig, default_path: Callable[[], Path]) -> list[ServedModel]:
    """The fleet's models in configuration order (``default_path`` gives the demo model when none is named)."""
    if cfg.models is None and cfg.models_dir is None:
        path = Path(cfg.model_path) if cfg.model_path else default_path()
        return [ServedModel(cfg.served_name(path), path, (), True, None, cfg)]
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
    files = sorted(folder.glob("*.gguf"))
    if not files and not listed:
        raise ConfigError(f"models_dir: {folder} holds no .gguf file")
    fresh = [f for f in files if f.stem not in taken and str(f.resolve()) not in taken]
    return [ModelEntry.model_validate({"name": f.stem, "path": str(f)}) for f in fresh]


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
        cfg = FleetConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_errors(e, f"invalid settings for model '{entry.name}':")) from None
    ttl = entry.idle_ttl_s if entry.idle_ttl_s is not None else fleet.idle_ttl_s
    if entry.path is None:  # nothing is loaded here: always "loaded", never evicted
        return ServedModel(entry.name, None, tuple(entry.aliases), True, None, cfg, tuple(entry.remote))
    return ServedModel(entry.name, Path(entry.path), tuple(entry.aliases), entry.pinned or not several, ttl, cfg,
                       tuple(entry.remote))


def demands(served: list[ServedModel]) -> list[Demand]:
    """What the packer needs of each model with a file: its header read from it (raises ``GgufError``)."""
    from llamafleet.model.checkpoint import describe
    from llamafleet.placement.packing import Demand

    return [Demand(m.name, describe(m.path), m.cfg, m.pinned) for m in served if m.path is not None]
