"""API keys as tenants: who a key is (a name), what it may do (scopes, models), its priority class and its limits.

Two forms of ``api_keys_file``, told apart by their content:

* a plain list, one key per line (``#`` comments), as before: every key may use every route but ``/admin/``;
* a YAML mapping with ``keys:``, one entry per tenant (docs/OPERATIONS.md, "Tenants")::

      keys:
        - {name: agents, sha256: "<hex>", scopes: [inference, embeddings], models: ["chat*"],
           priority: interactive, limits: {requests_per_minute: 600, tokens_per_minute: 200000}}
        - {name: ci, key: sk-test-1234}

Keys in ``LLAMAFLEET_API_KEYS`` and in the admin forms (``LLAMAFLEET_ADMIN_API_KEYS``, ``admin_api_keys_file``, plain
lists) keep working beside either form; such a key has no limits and is named by the start of its hash
(``key-1a2b3c4d``, ``admin-…``), never by itself. A key is found by the SHA-256 digest of what the client sent: the
lookup's timing depends only on that digest, which an attacker cannot steer towards a stored one.
"""

from __future__ import annotations

import difflib
import fcntl
import fnmatch
import hashlib
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from llamafleet.engine.types import DEFAULT_PRIORITY
from llamafleet.paths import partial_path

KEYS_ENV = "LLAMAFLEET_API_KEYS"
ADMIN_KEYS_ENV = "LLAMAFLEET_ADMIN_API_KEYS"
Scope = Literal["inference", "embeddings", "admin", "metrics"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
PriorityClass = Literal["interactive", "default", "batch"]
PRIORITY_CLASSES: tuple[PriorityClass, ...] = get_args(PriorityClass)  # the engine admits index 0 first
PLAIN_SCOPES = frozenset[Scope]({"inference", "embeddings", "metrics"})  # a plain key's: everything but admin
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class ApiKeysError(ValueError):
    """The API keys cannot be loaded: a file missing or empty, or a keys file that is not valid."""


class Limits(BaseModel):
    """A tenant's limits (unset: none). Per minute: a bucket holding a minute's worth, refilled continuously."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    tokens_per_day: PositiveInt | None = None
    concurrent: PositiveInt | None = None

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return (self.requests_per_minute is not None or self.tokens_per_minute is not None
                or self.tokens_per_day is not None or self.concurrent is not None)


class KeyEntry(BaseModel):
    """One entry of a keys file."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the tenant's name in logs, metrics and usage")
    sha256: str | None = Field(None, description="the key's SHA-256 digest, hex (what `llamafleet keys add` writes)")
    key: str | None = Field(None, description="the key itself (tests and small setups)")
    scopes: list[Scope] = Field(default_factory=lambda: sorted(PLAIN_SCOPES))
    models: list[str] = Field(default_factory=lambda: ["*"], description="model names or globs it may use")
    priority: PriorityClass = "default"
    limits: Limits = Field(default_factory=Limits)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.fullmatch(v):
            raise ValueError(f"name {v!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
        return v

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("sha256 must be 64 hex digits (`llamafleet keys add` writes it)")
        return None if v is None else v.lower()

    @field_validator("scopes", mode="before")
    @classmethod
    def _scopes(cls, v: Any) -> Any:
        for s in v if isinstance(v, list) else ():
            if s not in SCOPES:
                near = difflib.get_close_matches(s, SCOPES, n=1)
                hint = f"did you mean '{near[0]}'?" if near else f"use some of: {', '.join(SCOPES)}"
                raise ValueError(f"unknown scope {s!r}: {hint}")
        return v

    @model_validator(mode="after")
    def _one_key(self) -> KeyEntry:
        if (self.sha256 is None) == (self.key is None):
            raise ValueError("give exactly one of 'sha256' (the key's digest) and 'key' (the key itself)")
        return self


class KeysFile(BaseModel):
    """A keys file in the tenants form."""

    model_config = ConfigDict(extra="forbid")
    keys: list[KeyEntry] = Field(min_length=1)
    cached_token_weight: float = Field(1.0, ge=0.0, le=1.0,
                                       description="how much a prompt token served from the prefix cache counts")
    usage_file: str | None = Field(None, description="SQLite file of usage per key and day, relative to this file's "
                                   "folder (default: this file's name with .usage.sqlite)")

    @model_validator(mode="after")
    def _unique(self) -> KeysFile:
        names = [k.name for k in self.keys]
        digests = [k.sha256 or digest(k.key or "").hex() for k in self.keys]
        for what, values in (("name", names), ("key", digests)):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                shown = ", ".join(names[values.index(v)] for v in twice)
                raise ValueError(f"two entries have the same {what} ({shown}); each tenant needs its own")
        return self


@dataclass(frozen=True)
class Tenant:
    """Who a key is, once recognised."""

    name: str
    scopes: frozenset[Scope]
    models: tuple[str, ...] = ("*",)
    priority: int = DEFAULT_PRIORITY
    limits: Limits = field(default_factory=Limits)
    plain: bool = True  # from a plain list or the environment: today's key, with today's answers

    @cached_property
    def limited(self) -> bool:
        """Whether any limit is set (asked on every request: kept)."""
        return self.limits.any

    def may_use(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, glob) for glob in self.models)


@dataclass(frozen=True)
class KeyRing:
    """Every key the server accepts, by digest; ``open``: no API key but admin keys (authentication is off outside
    the admin routes, as before tenants)."""

    tenants: dict[bytes, Tenant] = field(default_factory=dict)
    open: bool = True
    cached_token_weight: float = 1.0
    usage_file: str | None = None

    @property
    def has_admin(self) -> bool:
        return any("admin" in t.scopes for t in self.tenants.values())

    def identify(self, token: bytes) -> Tenant | None:
        """The tenant whose key ``token`` is, or None."""
        return self.tenants.get(digest(token))

    def names(self) -> list[str]:
        return sorted({t.name for t in self.tenants.values()})

    @classmethod
    def of(cls, api_keys: frozenset[str], admin_keys: frozenset[str] = frozenset()) -> KeyRing:
        """Plain keys (API and admin), as the environment and plain lists give them."""
        tenants = {digest(k): Tenant(f"key-{digest(k).hex()[:8]}", PLAIN_SCOPES) for k in api_keys}
        tenants |= {digest(k): Tenant(f"admin-{digest(k).hex()[:8]}", frozenset(SCOPES)) for k in admin_keys}
        return cls(tenants, open=not api_keys)


def effective_priority(key_class: int | None, requested: int | None) -> int:
    """The priority a request runs at: its key's class (None: a plain key or none, the default class), or the
    lower class the request asks for (vLLM's ``priority``: lower first), never a better one, clamped to the classes."""
    base = DEFAULT_PRIORITY if key_class is None else key_class
    return base if requested is None else min(len(PRIORITY_CLASSES) - 1, max(base, requested))


def digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def load_api_keys(keys_file: str | None, environ: Mapping[str, str] | None = None, variable: str = KEYS_ENV,
                  key: str = "api_keys_file") -> frozenset[str]:
    """Every plain key from the environment ``variable`` and the plain list ``keys_file`` (the config ``key`` that
    named it); empty means authentication is off (for admin keys: the admin routes are)."""
    env = os.environ if environ is None else environ
    keys = {k.strip() for k in env.get(variable, "").split(",") if k.strip()}
    if keys_file is not None:
        lines = _read(keys_file, key).splitlines()
        from_file = {line.split("#", 1)[0].strip() for line in lines} - {""}
        if not from_file:
            raise ApiKeysError(f"{key} {keys_file} holds no key; put one key per line")
        keys |= from_file
    return frozenset(keys)


def load_keyring(keys_file: str | None, admin_file: str | None = None,
                 environ: Mapping[str, str] | None = None) -> KeyRing:
    """Every key the server accepts: ``keys_file`` (a plain list or the tenants form), ``admin_file`` (a plain list)
    and the environment's; :class:`ApiKeysError` names the file, line and field of what is wrong."""
    env = os.environ if environ is None else environ
    parsed = _tenants_form(keys_file) if keys_file is not None else None
    plain = load_api_keys(None if parsed is not None else keys_file, env)
    admin = load_api_keys(admin_file, env, ADMIN_KEYS_ENV, "admin_api_keys_file")
    ring = KeyRing.of(plain, admin)
    if parsed is None:
        return ring
    tenants = {bytes.fromhex(e.sha256) if e.sha256 else digest(e.key or ""): Tenant(
        e.name, frozenset(e.scopes), tuple(e.models), PRIORITY_CLASSES.index(e.priority), e.limits, plain=False)
        for e in parsed.keys}
    where = Path(keys_file or ".")  # a relative usage_file is beside the keys file
    usage = str(where.parent / parsed.usage_file if parsed.usage_file else where.with_suffix(".usage.sqlite"))
    return KeyRing({**ring.tenants, **tenants}, False, parsed.cached_token_weight, usage)


def _read(path: str, key: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ApiKeysError(f"{key} {path} cannot be read ({e.strerror}); fix the path or unset it") from None


def _tenants_form(path: str) -> KeysFile | None:
    """The file as a :class:`KeysFile` if it is a YAML mapping (None: a plain list)."""
    text = _read(path, "api_keys_file")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None  # not YAML at all: a plain list of keys (they may hold any character)
    if not isinstance(node, yaml.MappingNode):
        return None
    try:
        return KeysFile.model_validate(yaml.safe_load(text))
    except ValidationError as e:
        problems = [f"  - {_where(node, err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
                    for err in e.errors()]
        raise ApiKeysError(f"api_keys_file {path} is not a valid keys file:\n" + "\n".join(problems)) from None


def _where(node: yaml.Node, loc: tuple[int | str, ...]) -> str:
    """``line N, 'keys[2].limits.concurrent'``: the deepest line of ``loc`` in the composed YAML ``node``."""
    line, path = node.start_mark.line, ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        child: Any = None
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        elif isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == part), None)
            child = child or next((k for k, _ in node.value if k.value == part), None)
        if child is None:
            break
        node, line = child, child.start_mark.line
    return f"line {line + 1}, '{path or '(top level)'}'"


def new_key() -> str:
    """A new random API key."""
    return "sk-" + secrets.token_urlsafe(32)


def add_entry(path: Path, entry: KeyEntry) -> None:
    """Append ``entry`` to the keys file ``path`` (created in the tenants form if missing); :class:`ApiKeysError`
    if the file is a plain list, already names the tenant, or the result would not be a valid keys file. Two ``keys
    add`` at once both land: the file is read and replaced under a lock beside it (``NAME.lock``), through a temporary
    name of this writer's own."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _append(path, entry)


def _append(path: Path, entry: KeyEntry) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else "keys:\n"
    if path.exists() and _tenants_form(str(path)) is None:
        raise ApiKeysError(f"{path} is a plain list of keys; move it to the tenants form (docs/OPERATIONS.md, "
                           "Tenants) or write a new file")
    if path.exists() and any(t.name == entry.name for t in load_keyring(str(path), environ={}).tenants.values()):
        raise ApiKeysError(f"{path} already has a tenant named '{entry.name}'; pick another name")
    line = yaml.safe_dump([{"name": entry.name} | entry.model_dump(exclude_none=True, exclude_defaults=True)],
                          default_flow_style=None, sort_keys=False, width=1 << 16)
    new = text.rstrip("\n") + "\n" + "".join("  " + ln + "\n" for ln in line.splitlines())
    tmp = partial_path(path)
    tmp.write_text(new, encoding="utf-8")
    try:
        _tenants_form(str(tmp))
    except ApiKeysError:
        tmp.unlink()
        raise
    tmp.replace(path)
