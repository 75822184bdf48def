"""The fleet's YAML configuration, validated with pydantic.

One file describes what to serve and how: ``model_path``, ``main_gpu``, ``split_ratio``, ``context_length``,
``batch_size`` and ``threads`` (the keys of the original single-model service, which load unchanged and keep their
meaning) and everything else, each with a sensible default. Unknown keys (with the nearest valid one suggested) and
wrong types are refused before anything loads, with the key named and the fix. Keys that are valid but cannot apply
on this machine (:func:`llamafleet.placement.advice.inapplicable`) are said, not silently taken. Command-line flags
override the file (see :func:`load_config` and :mod:`llamafleet.flags`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llamafleet.config_sections import LoraEntry, PrioritySettings, RemoteEntry, SpeculativeSettings
from llamafleet.model.hub_ref import model_stem
from llamafleet.rpc import INSECURE, parse_endpoint

SplitMode = Literal["auto", "none", "layer", "tensor"]
KvCacheType = Literal["f16", "q8_0", "q4_0"]
RoutingPolicy = Literal["prefix", "least_outstanding", "round_robin"]  # fleet/router.py implements them


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the file."""


# The keys a `models:` entry may set for its model alone; the others are the fleet's (one server, one port, ...).
PER_MODEL_KEYS = ("context_length", "parallel", "batch_size", "ubatch_size", "kv_cache_type", "flash_attn",
                  "gpus", "split_mode", "split_ratio", "main_gpu", "n_gpu_layers", "prefer", "speculative", "engine",
                  "cuda_graphs", "lora")


class ModelEntry(BaseModel):
    """One entry of the ``models:`` list: a model the fleet serves, loaded on demand (or kept loaded: ``pinned``).

    The per-model knobs (:data:`PER_MODEL_KEYS`) override the fleet's for this model; their values are checked by
    :class:`FleetConfig`'s own rules when the model's configuration is built (:func:`llamafleet.catalog`).
    """

    model_config = ConfigDict(extra="allow", frozen=True)  # the per-model knobs; anything else is refused

    name: str = Field(min_length=1, description="the name clients send as 'model'")
    path: str | None = Field(None, min_length=1, description="the GGUF file, or a hub reference (hf:ORG/REPO:QUANT); "
                             "unset: served by its remote members only")
    aliases: list[str] = Field(default_factory=list, description="other names clients may send for it")
    replicas: int | Literal["auto"] = Field(
        "auto", description="replicas while loaded; auto = 1 when the fleet has several models, else the plan's")
    pinned: bool = Field(False, description="loaded at start and never evicted")
    idle_ttl_s: float | None = Field(None, gt=0, description="unloaded after this long without a request; "
                                     "unset = the fleet's idle_ttl_s")
    remote: list[RemoteEntry] = Field(default_factory=list, description="remote members serving this model beside "
                                      "its local replicas (see docs/OPERATIONS.md, Remote members)")

    @field_validator("replicas")
    @classmethod
    def _replicas_positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("replicas must be 1 or more, or auto")
        return v

    @model_validator(mode="after")
    def _known_knobs(self) -> ModelEntry:
        if self.path is None and not self.remote:
            raise ValueError(f"model '{self.name}' needs a path (its GGUF file) or remote (servers that serve it)")
        unknown = sorted(set(self.model_extra or {}) - set(PER_MODEL_KEYS))
        problems = [unknown_key(k, [*PER_MODEL_KEYS, *ModelEntry.model_fields]) for k in unknown]
        try:  # the knobs' values, by the fleet's own rules
            FleetConfig.model_validate({k: v for k, v in self.knobs.items() if k in PER_MODEL_KEYS})
        except ValidationError as e:
            problems += [(f"'{'.'.join(map(str, x['loc']))}': " if x["loc"] else "")
                         + x["msg"].removeprefix("Value error, ") for x in e.errors()]
        if problems:  # every one of them, one per line (see describe_errors)
            raise ValueError("\n".join(problems))
        return self

    @property
    def knobs(self) -> dict[str, Any]:
        """The per-model knobs this entry sets."""
        return dict(self.model_extra or {})


class FleetConfig(BaseModel):
    """Everything ``llamafleet serve`` and ``llamafleet plan`` need to know. All fields are optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # What to serve.
    model_path: str | None = Field(None, description="GGUF file to serve, or a hub reference (hf:ORG/REPO:QUANT); "
                                   "unset = the built-in demo model")
    model_name: str | None = Field(None, description="name clients use in 'model'; default: the file's stem")
    engine: Literal["auto", "llama.cpp", "torch"] = Field(
        "auto", description="what serves the model: llama.cpp (a GGUF file) or torch (a Hugging Face checkpoint "
        "folder, the torch extra); auto = torch for a folder, llama.cpp for a file")
    cuda_graphs: Literal["auto", "off"] = Field(
        "auto", description="torch engine: replay each decode step as a CUDA graph (auto: where the model is on one "
        "GPU); off = eager steps (see docs/TORCH.md)")

    models: list[ModelEntry] | None = Field(
        None, description="several models, loaded on demand and placed together (see docs/OPERATIONS.md, "
        "Several models); replaces model_path / model_name")
    models_dir: str | None = Field(None, description="serve every .gguf file in this folder, named by its file stem")
    remote: list[RemoteEntry] = Field(
        default_factory=list, description="remote members: OpenAI-compatible servers that serve the model beside "
        "(or, with no model_path, instead of) the local replicas (see docs/OPERATIONS.md, Remote members)")
    idle_ttl_s: float | None = Field(None, gt=0, description="with several models: an unpinned model idle this long "
                                     "is unloaded; unset = kept until evicted")
    max_loading_queue: int = Field(64, ge=0, description="requests waiting for their model to load, over all "
                                   "models (then 503 with Retry-After)")

    # Where to listen.
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)

    # Replicas on other hosts (see docs/DEPLOYMENT.md, Ray).
    ray: str | None = Field(None, description="run the replicas on this Ray cluster: 'auto' (the one `ray start` "
                            "joined this host to) or its address HOST:PORT; unset = on this machine")
    ray_port: int = Field(0, ge=0, le=65535, description="with ray: the port replicas connect back to the API "
                          "process on; 0 = any free port")
    ray_place_timeout_s: float = Field(30.0, gt=0, description="with ray: how long a replica waits for a node "
                                       "with room before its load fails (and is retried with backoff)")

    # Capacity of each replica.
    # Left unset (not merely equal to the default), these two are fitted by the planner: see docs/PLANNER.md.
    context_length: int = Field(4096, ge=64, description="tokens of context per sequence (prompt + answer)")
    parallel: int = Field(8, ge=1, le=256, description="sequence slots per replica (continuous batching width)")
    batch_size: int = Field(2048, ge=1, description="n_batch: most tokens one llama_decode step takes (running "
                            "answers + prompt chunks)")
    ubatch_size: int | None = Field(None, ge=1, description="n_ubatch: physical micro-batch; default = "
                                    "min(batch_size, 512)")
    prefill_tokens: int = Field(512, ge=1, description="most prompt tokens one step prefills, besides the running "
                                "answers' tokens (see docs/OPERATIONS.md, Prefill)")
    threads: int | None = Field(None, ge=1, description="CPU threads per replica; default = every core but one, "
                                "shared by a CPU plan's replicas (see engine/cores.py)")
    kv_cache_type: KvCacheType = "f16"
    flash_attn: bool | None = Field(None, description="None = let llama.cpp decide")
    backend_sampling: bool = Field(False, description="sample greedy requests inside llama.cpp's graph (GPU)")
    prefix_cache: bool = Field(True, description="start each prompt from KV already computed for its prefix "
                               "(see docs/OPERATIONS.md)")
    speculative: SpeculativeSettings = Field(
        default_factory=lambda: SpeculativeSettings.model_validate({}), description="speculative decoding: mode, "
        "draft_model, max_draft, ngram_min, ngram_max, max_batch (see docs/OPERATIONS.md, Speculative decoding)")
    lora: list[LoraEntry] = Field(default_factory=list, description="LoRA adapters served with the model: each a "
                                  "path (or hf: reference), an optional name and scale (see docs/MODELS.md, LoRA)")
    priorities: PrioritySettings = Field(
        default_factory=lambda: PrioritySettings.model_validate({}), description="priority classes in each replica's "
        "scheduler: reserve_s, batch_share, batch_alone_cost (see docs/OPERATIONS.md, Tenants)")
    cache_ram_mib: int | None = Field(None, ge=0, description="RAM tier of the KV cache per replica: slots' KV kept "
                                      "when their slot is reused (0 = off; default: a quarter of the "
                                      "RAM the plan leaves, at most 8192)")
    cache_park: int = Field(0, ge=0, description="sessions parked in the KV cache beside the slots, per replica: a "
                            "slot's KV moved into a spare sequence of the context when the slot is reused, and back "
                            "(no host copy; each costs a slot's KV memory, the tier one spare more; 0 = off)")
    cache_dir: str | None = Field(None, description="disk tier of the KV cache: states evicted from RAM and saved "
                                  "at shutdown, kept across restarts (default: off)")
    cache_disk_mib: int = Field(20480, ge=1, description="most disk the KV tier's files of one model take")

    # GPU placement (see placement/planner.py).
    gpus: list[int] | None = Field(None, description="GPU indices to use; default = all")
    replicas: int | None = Field(None, ge=1, description="replica count; default = what the plan chooses")
    split_mode: SplitMode = "auto"
    split_ratio: list[float] | None = Field(None, description="share of the model per GPU of a split replica")
    main_gpu: int | None = Field(None, ge=0)
    n_gpu_layers: int = Field(-1, ge=-1, description="-1 = offload every layer")
    vram_margin_mib: int = Field(
        1024, ge=0, description="memory kept free on every GPU (also covers the CUDA context and memory pool)"
    )
    prefer: Literal["throughput", "latency"] = "throughput"
    # Other hosts' devices through llama.cpp's RPC backend (see docs/DEPLOYMENT.md, One model across hosts).
    rpc_servers: list[str] = Field(default_factory=list, description="host:port of `llamafleet rpc-server`s on other "
                                   "hosts whose devices take part of the model's layers; needs rpc_trusted_network")
    rpc_trusted_network: bool = Field(False, description="the opt-in for rpc_servers: " + INSECURE)
    rpc_link_gbps: float = Field(10.0, gt=0, description="bandwidth of the link to the RPC hosts in Gbit/s, for the "
                                 "plan's estimates (load time, bytes per token)")
    routing: RoutingPolicy = Field(
        "prefix", description="how requests are spread over replicas (see docs/OPERATIONS.md, Routing)"
    )

    # Limits and backpressure (see docs/OPERATIONS.md).
    max_queue_per_replica: int = Field(
        32, ge=0, description="sequences waiting beyond a replica's slots before it takes no more (then 429)"
    )
    max_queue: int = Field(128, ge=0, description="sequences waiting beyond slots on all replicas together (then 429)")
    request_timeout_s: float = Field(600.0, gt=0, description="a request still running after this long fails (504)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body accepted (then 413)")
    max_header_bytes: int = Field(
        64 << 10, ge=1024, description="largest request head (request line and headers) accepted (then 431)"
    )
    header_timeout_s: float = Field(10.0, gt=0, description="a request head must arrive within this long (then 408)")
    body_timeout_s: float = Field(
        30.0, gt=0, description="a request body must arrive within this long after its head (then 408)"
    )
    write_timeout_s: float = Field(
        30.0, gt=0, description="a client that reads nothing of its answer for this long is disconnected"
    )
    drain_timeout_s: float = Field(
        10.0, ge=0, description="at a stop signal, running requests get this long to finish; then they end with 503"
    )

    # Reasoning models (see docs/MODELS.md).
    reasoning_budget: int | None = Field(
        None, ge=1, description="tokens a thinking model may spend in its think block when a request sets no budget "
        "(then the block is closed with the model's own end marker); unset: no limit"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="variables every chat template gets unless a request sets them (e.g. "
        "{enable_thinking: false})"
    )

    # Access.
    api_keys_file: str | None = Field(
        None, description="file of API keys, one per line ('#' comments), or a keys file of tenants (names, scopes, "
        "models, priorities, limits: docs/OPERATIONS.md); with LLAMAFLEET_API_KEYS, turns auth on"
    )
    admin_api_keys_file: str | None = Field(
        None, description="file of admin API keys (the same form); with LLAMAFLEET_ADMIN_API_KEYS, the only keys that "
        "open /admin/ (loading and unloading models)")
    cors_origins: list[str] = Field(default_factory=list, description="origins allowed by CORS; empty = CORS off")
    recent_request_contents: bool = Field(
        False, description="keep the first 2 KiB of each recent request's body and answer for the dashboard (/ui); "
        "off: only method, route, status, latency and token counts"
    )

    # Stored responses (POST /v1/responses with store, previous_response_id; see docs/API.md).
    responses_store_max: int = Field(1024, ge=0, description="most responses kept for previous_response_id and GET "
                                     "/v1/responses/{id}, oldest dropped first (0 = none are kept)")
    responses_store_mib: int = Field(64, ge=1, description="most memory the stored responses' conversations take in "
                                     "the API process, oldest dropped first")
    responses_ttl_s: float = Field(86400.0, gt=0, description="a stored response is dropped this long after it "
                                   "was stored")

    # Watchdog.
    watchdog_interval_s: float = Field(2.0, gt=0, description="how often GPU memory and slots are checked")
    vram_warn_fraction: float = Field(0.85, gt=0, le=1, description="GPU memory use that logs a warning")
    vram_refuse_free_mib: int = Field(
        256, ge=0, description="free memory on a GPU below which new work gets 503 (llama.cpp allocates the KV cache "
        "up front, so a well-planned GPU can sit above the warning watermark; running out is what to avoid)"
    )
    slot_leak_s: float = Field(
        30.0, gt=0, description="busy slots with no request in flight for this long: the replica is restarted"
    )
    heartbeat_timeout_s: float = Field(
        60.0, gt=0, description="a loaded worker that sends nothing for this long is killed as hung"
    )
    suspect_after_s: float = Field(
        2.0, gt=0, description="a loaded worker silent this long (or 5x its recent p99 step time, if longer) is "
        "suspect: it gets no new work while another replica can take it, and its sequences not yet started move "
        "elsewhere, until it speaks again"
    )

    # Logging.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    llama_log_level: Literal["debug", "info", "warning", "error"] = Field(
        "warning", description="level at which llama.cpp's own log lines reach Python logging"
    )

    @field_validator("split_ratio")
    @classmethod
    def _ratio_positive(cls, v: list[float] | None) -> list[float] | None:
        if v is None:
            return v
        if not v or any(x < 0 for x in v) or sum(v) <= 0:
            raise ValueError("split_ratio needs one non-negative share per GPU, e.g. [0.5, 0.5]")
        return v

    @field_validator("rpc_servers")
    @classmethod
    def _endpoints(cls, v: list[str]) -> list[str]:
        for text in v:
            parse_endpoint(text)
        if len(set(v)) < len(v):
            raise ValueError("an RPC server is listed twice: list each host:port once (a server takes one client)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> FleetConfig:
        problems = self._conflicts()
        if problems:  # every one of them, one per line (see describe_errors)
            raise ValueError("\n".join(problems))
        return self

    def _conflicts(self) -> list[str]:
        """Keys that are each valid but cannot go together, each with the fix."""
        out = []
        if self.rpc_servers and not self.rpc_trusted_network:
            out.append("rpc_servers needs the opt-in rpc_trusted_network: true. " + INSECURE + "; set it only if that "
                       "holds for every host listed, else remove rpc_servers")
        if self.rpc_servers and (self.models is not None or self.models_dir is not None):
            out.append("rpc_servers splits the one model of model_path over other hosts; it cannot be combined with "
                       "models or models_dir: keep one")
        if self.ubatch_size is not None and self.ubatch_size > self.batch_size:
            out.append(f"ubatch_size ({self.ubatch_size}) cannot exceed batch_size ({self.batch_size})")
        several = [k for k in ("models", "models_dir") if getattr(self, k) is not None]
        single = [k for k in ("model_path", "model_name") if getattr(self, k) is not None]
        if several and single:
            verb = "names" if len(single) == 1 else "name"
            out.append(f"{' and '.join(single)} {verb} one model, {' and '.join(several)} several: keep one way (a "
                       "models: entry takes name and path)")
        if self.remote and several:
            out.append("remote: members serve the one model of model_path / model_name; with models:, give each "
                       "model entry its own remote: list")
        if self.ray is not None and several:
            out.append(f"ray serves one model for now, but {' and '.join(several)} "
                       f"{'names' if len(several) == 1 else 'name'} several: serve one model (model_path) with ray, "
                       "or leave ray unset")
        adapters = [e.adapter_name for e in self.lora]
        if dup := sorted({n for n in adapters if adapters.count(n) > 1}):
            out.append(f"lora: the name {', '.join(map(repr, dup))} is given to two adapters; give each its own name")
        if self.lora and self.engine == "torch":
            out.append("lora: adapters are served by the llama.cpp engine (a GGUF model); remove lora or the torch "
                       "engine")
        names: dict[str, str] = {}
        for entry in self.models or ():
            for name in (entry.name, *entry.aliases):
                if name in names:
                    out.append(f"models: '{name}' names both '{names[name]}' and '{entry.name}'; give each model and "
                               "alias a distinct name")
                names[name] = entry.name
        return out

    @property
    def n_ubatch(self) -> int:
        return self.ubatch_size or min(self.batch_size, 512)

    def served_name(self, model_path: str | Path) -> str:
        """The name clients send as 'model' for the file ``model_path``: ``model_name``, else the file's stem (a split
        model's without ``-00001-of-0000N``; never the GGUF's own ``general.name``, which clients do not know)."""
        return self.model_name or model_stem(Path(model_path).name)


def read_yaml(path: Path, what: str, error: type[ValueError]) -> Any:
    """Parse the YAML file ``path``; a missing file or invalid YAML raises ``error`` naming ``what``, the file and,
    for a syntax error, the line and column."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} file not found: {path}") from None
    except OSError as e:
        raise error(f"cannot read the {what} file {path}: {e.strerror}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        why = ", ".join(str(x) for x in (e.context, e.problem) if x)
        raise error(f"{where}: not valid YAML ({why})") from None
    except yaml.YAMLError as e:
        raise error(f"{path} is not valid YAML: {e}") from None


def unknown_key(key: str, known_keys: Iterable[str]) -> str:
    """An unknown key with the nearest known one ("did you mean"), or the whole list when none is near."""
    known = sorted(known_keys)
    near = difflib.get_close_matches(key, known, n=1)
    if near:
        return f"unknown key '{key}': did you mean '{near[0]}'?"
    return f"unknown key '{key}': remove it or use one of: {', '.join(known)}"


def describe_errors(err: ValidationError, header: str, known_keys: Iterable[str] = (),
                    flags: Iterable[str] = ()) -> str:
    """One line per pydantic error (every one of them), naming the key; with ``known_keys``, an unknown key gets
    :func:`unknown_key`; a key in ``flags`` is said to come from a command-line flag."""
    known = sorted(known_keys)
    origin = dict.fromkeys(flags, " (a command-line flag)")
    lines = [header]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden" and known:
            if len(e["loc"]) >= 3 and e["loc"][-3] == "remote":  # a remote member's key: its own keys are known
                prefix = ".".join(map(str, e["loc"][:-1])) + "."
                lines.append(f"  - {unknown_key(key, [prefix + k for k in RemoteEntry.model_fields])}")
            else:
                lines.append(f"  - {unknown_key(key, known)}")
        elif e["type"] == "value_error":  # our own checks: their message names the key and the fix
            for msg in e["msg"].removeprefix("Value error, ").splitlines():
                lines.append(f"  - '{key}'{origin.get(key, '')}: {msg}" if e["loc"] else f"  - {msg}")
        else:
            lines.append(f"  - '{key}'{origin.get(key, '')}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> FleetConfig:
    """Read ``path`` (YAML) if given, apply ``overrides`` (flags; ``None`` values are ignored), validate."""
    data: dict[str, Any] = {}
    sources = []
    if path is not None:
        p = Path(path)
        sources.append(str(p))
        raw = read_yaml(p, "config", ConfigError)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{p} must hold a mapping of keys to values, not {type(raw).__name__}")
        data.update(raw)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    if flags:
        sources.append("the command-line flags")
    data.update(flags)
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as e:
        header = f"invalid configuration in {' and '.join(sources) or 'the defaults'}:"
        raise ConfigError(describe_errors(e, header, FleetConfig.model_fields, flags)) from None

