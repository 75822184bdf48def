"""The command-line flags that set a fleet config key: one table, so a knob has one flag, one help and one default.

``serve``, ``plan``, ``consistency`` and ``bench engine`` all take some of the same knobs. Each command names the
keys it exposes (:data:`COMMAND_KEYS`) and calls :func:`add_flags`; :func:`overrides` turns the parsed flags back
into config keys for :func:`llamafleet.config.load_config`. A flag's type, choices and default come from its
:class:`~llamafleet.config.FleetConfig` field, so they cannot drift from the config file's. Its argparse default is
``None``: a flag that is not given leaves the config file's value (or the field's default) alone. Older spellings
(``--n-batch``) stay accepted as hidden aliases. The README's "Flags and config keys" table is
:func:`markdown_table`; a test keeps the two equal.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from llamafleet.config import FleetConfig


@dataclass(frozen=True)
class Flag:
    key: str  # the FleetConfig key it sets; also the argparse dest
    flag: str
    help: str  # what it does; the config key and the default are added by help_text()
    metavar: str | None = None
    unset: str = ""  # what the field's default of None means, e.g. "the built-in demo model"
    aliases: tuple[str, ...] = ()  # older spellings: still accepted, not shown in --help
    fitted: str = ""  # left unset, what the planner may choose instead of the default ({}: the default)


FLAGS: tuple[Flag, ...] = (
    Flag("model_path", "--model", "GGUF model file; for serve and plan also a hub reference, hf:ORG/REPO:QUANT",
         "FILE", unset="the built-in demo model"),
    Flag("model_name", "--model-name", "the name clients send as 'model' and /v1/models lists", "NAME",
         unset="the file name without .gguf"),
    Flag("models_dir", "--models-dir", "serve every .gguf file in this folder under its file name (without .gguf), "
         "loaded on demand", "DIR", unset="none"),
    Flag("host", "--host", "address to listen on"),
    Flag("port", "--port", "port to listen on"),
    Flag("ray", "--ray", "run each replica as a Ray actor on this cluster ('auto' or HOST:PORT; see "
         "docs/DEPLOYMENT.md)", "ADDRESS", unset="on this machine"),
    Flag("replicas", "--replicas", "number of replicas", "N", unset="what the plan picks"),
    Flag("parallel", "--parallel", "sequence slots per replica (requests decoded together)", "N",
         fitted="unset: fewer, down to 1, if {} do not fit"),
    Flag("context_length", "--ctx", "context per sequence, prompt + answer", "TOKENS",
         fitted="unset: at most the trained context, down to 2048 if {} does not fit"),
    Flag("batch_size", "--batch", "n_batch: most tokens per llama_decode step", "TOKENS", aliases=("--n-batch",)),
    Flag("threads", "--threads", "CPU threads per replica", "N",
         unset="every core but one; a CPU plan shares them between its replicas"),
    Flag("split_mode", "--split-mode", "how a replica spreads over GPUs (auto: one GPU per replica when it fits)"),
    Flag("prefer", "--prefer", "what automatic placement optimises"),
    Flag("backend_sampling", "--backend-sampling",
         "sample greedy requests inside llama.cpp's graph (on the GPU) instead of on the host"),
    Flag("cuda_graphs", "--cuda-graphs", "torch engine: replay each decode step as a CUDA graph where the model is "
         "on one GPU (off: eager steps)"),
    Flag("cache_ram_mib", "--cache-ram", "RAM tier of the KV cache per replica (0 = off): a slot's KV is kept "
         "there when the slot is reused, and restored for a prompt that starts with it", "MIB",
         unset="CPU plans: a quarter of the RAM the plan leaves, at most 8192; GPU plans: off"),
    Flag("cache_park", "--cache-park", "sessions parked in the KV cache beside the slots, per replica: a slot's KV "
         "is moved into a spare sequence of the context when the slot is reused (no host copy; each costs a slot's "
         "KV memory; the tier one spare more)", "N"),
    Flag("cache_dir", "--cache-dir", "disk tier of the KV cache: what leaves the RAM tier, and the slots at "
         "shutdown, kept in this folder across restarts", "DIR", unset="off"),
    Flag("routing", "--routing", "how requests are spread over replicas"),
    Flag("max_queue_per_replica", "--max-queue-per-replica",
         "sequences waiting beyond a replica's slots before it refuses more with 429", "N"),
    Flag("max_queue", "--max-queue", "sequences waiting beyond slots on all replicas together before 429", "N"),
    Flag("request_timeout_s", "--request-timeout", "a request running longer fails with 504", "S"),
    Flag("api_keys_file", "--api-keys-file", "API keys, one per line, or a keys file of tenants (docs/OPERATIONS.md, "
         "Tenants); LLAMAFLEET_API_KEYS adds more (comma-separated); with any key set, requests need "
         "'Authorization: Bearer KEY'", "FILE", unset="none"),
    Flag("log_level", "--log-level", "log level of this process and its workers"),
)
BY_KEY = {f.key: f for f in FLAGS}

# The keys each command takes as flags, in the order --help lists them.
COMMAND_KEYS: dict[str, tuple[str, ...]] = {
    "serve": tuple(f.key for f in FLAGS),
    "plan": ("model_path", "models_dir", "replicas", "parallel", "context_length", "batch_size", "split_mode",
             "prefer"),
    "consistency": ("model_path", "context_length", "batch_size", "threads", "log_level"),
    "bench engine": ("model_path", "batch_size", "threads", "backend_sampling", "cuda_graphs"),
}


def _value_type(key: str) -> Any:
    """The field's type without ``None``: ``int``, ``float``, ``str``, ``bool`` or a ``Literal``."""
    annotation = FleetConfig.model_fields[key].annotation
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation


def default_text(key: str) -> str:
    """The field's default as a reader would write it."""
    default = FleetConfig.model_fields[key].default
    if default is None:
        return BY_KEY[key].unset or "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    return f"{default} ({BY_KEY[key].fitted.format(default)})" if BY_KEY[key].fitted else str(default)


def help_text(key: str) -> str:
    f = BY_KEY[key]
    return f"{f.help} (config key {key}; default: {default_text(key)})".replace("%", "%%")


def _lenient(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """``kind`` (``int``, ``float``, ``str``) of a flag's text, or the text itself when it is not one: the config's
    validation then names it together with every other bad value, where argparse would stop at the first."""

    def convert(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            return text

    return convert


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the flags of ``command`` (a key of :data:`COMMAND_KEYS`) to ``parser``, each with dest = its key."""
    for key in COMMAND_KEYS[command]:
        f = BY_KEY[key]
        kind = _value_type(key)
        spec: dict[str, Any] = {"dest": key, "default": None}
        if kind is bool:
            spec["action"] = "store_true"
        elif get_origin(kind) is Literal:
            spec["choices"] = get_args(kind)
        else:
            spec |= {"type": _lenient(kind), "metavar": f.metavar}
        parser.add_argument(f.flag, help=help_text(key), **spec)
        for alias in f.aliases:
            parser.add_argument(alias, help=argparse.SUPPRESS, **spec)


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FLEET_YAML",
                        help="fleet configuration file (see examples/fleet.yaml); flags given with it override it")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the parsed flags set (``None`` where a flag was not given: load_config skips those)."""
    return {f.key: getattr(args, f.key) for f in FLAGS if hasattr(args, f.key)}


def markdown_table() -> str:
    """The flags and config keys as the README shows them."""
    rows = ["| flag | config key | default | what it sets | commands |", "|---|---|---|---|---|"]
    for f in FLAGS:
        commands = ", ".join(f"`{c}`" for c, keys in COMMAND_KEYS.items() if f.key in keys)
        flag = f"`{f.flag}`" + "".join(f" (also `{a}`)" for a in f.aliases)
        rows.append(f"| {flag} | `{f.key}` | {default_text(f.key)} | {f.help} | {commands} |")
    return "\n".join(rows)
