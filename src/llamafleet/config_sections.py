"""Sections of the fleet's configuration that stand on their own: a remote member, speculative decoding, a LoRA
adapter, priorities.

:mod:`llamafleet.config` puts them together; a new group of settings that needs nothing from the rest of the file
belongs here (or beside the code it configures), one field in :class:`llamafleet.config.FleetConfig` naming it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llamafleet.engine.speculative.settings import MAX_DRAFT_LIMIT, MAX_NGRAM
from llamafleet.engine.types import LoraSpec
from llamafleet.model.hub_ref import is_ref, model_stem, parse_ref

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # it follows "MODEL:" in a model name


class RemoteEntry(BaseModel):
    """One remote member: an OpenAI-compatible server that serves the model as one more replica (see
    docs/OPERATIONS.md, Remote members). Its key is read from the environment or a file, never written here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(min_length=1, description="the server's address, e.g. http://10.0.0.2:8080 (a trailing /v1 "
                     "is accepted)")
    model: str | None = Field(None, min_length=1, description="the upstream's name of the model; unset = the first "
                              "one its /v1/models lists")
    api_key_env: str | None = Field(None, min_length=1, description="environment variable holding its API key")
    api_key_file: str | None = Field(None, min_length=1, description="file holding its API key")
    max_concurrency: int = Field(8, ge=1, le=1024, description="sequences sent to it at once (its slots)")
    timeout_s: float = Field(60.0, gt=0, description="longest wait for its next byte (then 504)")
    llama_cpp: bool = Field(True, description="it is llamafleet or llama-server: it takes llama.cpp's fields "
                            "(its sampling extensions, grammar, ignore_eos); false for other providers")

    @model_validator(mode="after")
    def _checked(self) -> RemoteEntry:
        scheme, _, rest = self.url.partition("://")
        if scheme not in ("http", "https") or not rest.strip("/"):
            raise ValueError(f"url must start with http:// or https:// and name a host, not {self.url!r}")
        if "@" in rest.split("/", 1)[0]:
            raise ValueError("url must not hold credentials (they would show in logs); put the key in a file or "
                             "variable named by api_key_file or api_key_env")
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("give api_key_env or api_key_file, not both")
        return self


class SpeculativeSettings(BaseModel):
    """Speculative decoding (see docs/OPERATIONS.md, Speculative decoding): drafts verified in the batched step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["off", "ngram", "draft"] = Field("off", description="off; ngram: prompt lookup, drafts copied "
                                                   "from the sequence's own prompt and answer; draft: a smaller "
                                                   "model with the same vocabulary (draft_model) drafts")
    draft_model: str | None = Field(None, min_length=1, description="with mode draft: the draft model's GGUF file "
                                    "or hub reference (same vocabulary as the served model; loaded beside it in each "
                                    "replica)")
    max_draft: int = Field(8, ge=1, le=MAX_DRAFT_LIMIT, description="most tokens drafted for one sequence per step")
    ngram_min: int = Field(2, ge=1, le=MAX_NGRAM, description="shortest tail of the sequence looked up (ngram)")
    ngram_max: int = Field(4, ge=1, le=MAX_NGRAM, description="longest tail looked up, tried first (ngram)")
    max_batch: int = Field(4, ge=1, description="speculate only in steps where at most this many sequences decode")
    draft_cost: float | None = Field(None, ge=0.0, le=1.0, description="one more token's cost as a share of a "
                                     "one-token step, which decides whether drafts pay; unset = measured, 0 = always")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML reads a bare `off` as false

    @model_validator(mode="after")
    def _ngram_range(self) -> SpeculativeSettings:
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) cannot exceed ngram_max ({self.ngram_max})")
        if self.mode == "draft" and self.draft_model is None:
            raise ValueError("mode draft needs draft_model: the path of a GGUF model with the served model's "
                             "vocabulary (or use mode ngram, which needs no second model)")
        if self.mode != "draft" and self.draft_model is not None:
            raise ValueError(f"draft_model is only used with mode draft (mode is {self.mode}): set mode: draft, or "
                             "remove draft_model")
        if self.draft_model is not None and is_ref(self.draft_model):
            parse_ref(self.draft_model)  # its form checked now; it is fetched before planning
        elif self.draft_model is not None and not Path(self.draft_model).is_file():
            raise ValueError(f"draft_model: no GGUF file at {self.draft_model}")
        return self


class LoraEntry(BaseModel):
    """One LoRA adapter served with a model (see docs/MODELS.md, LoRA adapters): loaded once per replica, applied to
    the requests that pick it. A bare string is its path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, description="the adapter's GGUF file, or a hub reference (hf:ORG/REPO/FILE.gguf)")
    name: str | None = Field(None, description="what clients pick it by: the model name MODEL:NAME, or 'id' in a "
                             "request's lora list; default: the file's stem")
    scale: float = Field(1.0, allow_inf_nan=False, description="its scale when a request picks it by name or gives "
                         "no scale (0 = the base model)")

    @model_validator(mode="before")
    @classmethod
    def _bare_path(cls, v: Any) -> Any:
        return {"path": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _checked(self) -> LoraEntry:
        if self.name is not None and not ADAPTER_NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: use letters, digits, '.', '_' and '-' (it follows 'MODEL:' in a "
                             "model name)")
        if is_ref(self.path):
            parse_ref(self.path)  # its form checked now; it is fetched before planning (its file: by the planner)
        elif self.name is None and not ADAPTER_NAME.match(model_stem(Path(self.path).name)):
            raise ValueError(f"path: the file's stem {model_stem(Path(self.path).name)!r} is no adapter name; give "
                             "the adapter a name (letters, digits, '.', '_', '-')")
        return self

    @property
    def adapter_name(self) -> str:
        return self.name or model_stem(Path(self.path).name)

    def spec(self) -> LoraSpec:
        return LoraSpec(self.adapter_name, self.path, self.scale)


class PrioritySettings(BaseModel):
    """How each replica's scheduler favours requests of a better priority class than ``batch`` (an API key's class:
    see docs/OPERATIONS.md, Tenants, and engine/scheduler.py). Nothing here acts unless keys of both kinds are used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reserve_s: float = Field(30.0, ge=0, description="a replica's last free slot is kept from batch work this long "
                             "after a request of a better class last arrived (0 = never kept)")
    batch_share: float | None = Field(0.1, ge=0, description="beside a better request's prompt, the most batch work "
                                      "adds to the time of the pass (0.1: 10%; at least one token while that prompt "
                                      "goes on after the pass); "
                                      "unset (null) = no limit, and batch passes are not kept short either")
    batch_alone_cost: float = Field(0.1, ge=0, lt=1, description="while better work is about (it arrived in the last "
                                    "reserve_s), passes of batch work alone are kept short: a pass's fixed time is "
                                    "this share of theirs (batch work about this much slower), so that a better "
                                    "request arriving waits for a short pass; 0 = not kept short")
