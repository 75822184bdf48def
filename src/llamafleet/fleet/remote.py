"""Remote members: a replica that is another OpenAI-compatible server (another llamafleet, a llama-server, a provider).

The design: a remote member is a replica like any other, only its worker process loads no model. It runs
:func:`llamafleet.fleet.remote_worker.remote_main`, which speaks the same pipe protocol as a llama.cpp worker
(:mod:`llamafleet.fleet.messages`): ``Ready`` once the upstream answers, one ``StepOutputs`` per relayed chunk,
heartbeats, and an exit when the upstream stops answering. So everything above the pipe works unchanged and counts
members exactly as it counts local replicas: the replica set's supervision (death noticed at once, restart with
backoff, which is how an unreachable upstream is re-probed), the router (a member's slots are its
``max_concurrency``), the dispatcher, metrics, aggregation and every API route. The seam in
:class:`~llamafleet.fleet.replicas.ReplicaSpec` is one field (``remote``) that picks the worker's entry point.
The alternative, relaying in the API process itself, would have needed a second path through dispatch, health and
metrics for the same outcomes.

This module holds what the API process needs to know of a member: who it is (:class:`RemoteMember`, built from the
configuration by :func:`members` with its key read from the environment or a file, never printed), its replica spec
(:func:`member_specs`) and what it cannot relay (:func:`unrelayable`: the dispatcher routes such a request only to
replicas that can serve it, or refuses it with 400 before routing). The HTTP side is in
:mod:`llamafleet.fleet.relay` and :mod:`llamafleet.fleet.remote_worker`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from llamafleet.config import ConfigError, FleetConfig, RemoteEntry
from llamafleet.engine.types import LLAMA_CPP_KNOBS, EngineConfig
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.replicas import ReplicaSpec

NO_CONTEXT_LIMIT = 2**31 - 1  # a member's context is the upstream's business; it refuses what does not fit (400)


@dataclass(frozen=True)
class RemoteMember:
    """One upstream server, as its worker needs it. ``api_key`` is kept out of ``repr`` (and so out of logs)."""

    url: str  # the server's root, without /v1: "http://10.0.0.2:8080"
    model: str | None  # the upstream's name of the model; None: the first one its /v1/models lists
    max_concurrency: int = 8  # sequences it is given at once: its slots in the router
    timeout_s: float = 60.0  # the longest wait for the upstream's next byte (connect, first token, between chunks)
    llama_cpp: bool = True  # it takes llama.cpp's extra fields (LLAMA_CPP_KNOBS, grammar, ignore_eos)
    api_key: str | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"remote {self.url}"


def root_url(url: str) -> str:
    """``url`` without a trailing slash or ``/v1`` (both spellings are common in clients' settings)."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def _read_key(entry: RemoteEntry, where: str) -> str | None:
    if entry.api_key_env is not None:
        key = os.environ.get(entry.api_key_env, "").strip()
        if not key:
            raise ConfigError(f"{where}.api_key_env: the environment variable {entry.api_key_env} is not set or "
                              "empty; export it with the upstream's API key, or remove api_key_env")
        return key
    if entry.api_key_file is not None:
        try:
            key = Path(entry.api_key_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(f"{where}.api_key_file: cannot read {entry.api_key_file} ({e.strerror}); give a "
                              "readable file holding the upstream's API key") from None
        if not key:
            raise ConfigError(f"{where}.api_key_file: {entry.api_key_file} is empty; put the upstream's API key "
                              "in it")
        return key
    return None


def members(entries: list[RemoteEntry], where: str = "remote") -> list[RemoteMember]:
    """The configured members, keys read now (:class:`ConfigError` naming the field if one cannot be)."""
    return [RemoteMember(root_url(e.url), e.model, e.max_concurrency, e.timeout_s, e.llama_cpp,
                         _read_key(e, f"{where}[{i}]")) for i, e in enumerate(entries)]


def remote_context(cfg: FleetConfig) -> int:
    """The context per sequence of a model served by remote members only: the upstream's (it refuses what does not
    fit), unless ``context_length`` is set to refuse too-long requests here first."""
    return cfg.context_length if "context_length" in cfg.model_fields_set else NO_CONTEXT_LIMIT


def member_specs(remote: list[RemoteMember], n_ctx_per_seq: int, prefix: str = "") -> list[ReplicaSpec]:
    """A replica spec per member (``prefix`` starts its label, e.g. the model's name)."""
    return [ReplicaSpec({}, EngineConfig(m.url, n_seq=m.max_concurrency, n_ctx_per_seq=n_ctx_per_seq),
                        f"{prefix}{m.label}", remote=m) for m in remote]


def unrelayable(msg: Submit, member: RemoteMember) -> str | None:
    """Why ``member`` cannot serve ``msg`` as asked, worded for the client; None if it can.

    What this relay does not carry: embeddings (they go to local replicas). What an OpenAI-compatible upstream cannot
    express: tokenizing and fill-in-the-middle (they need the model's tokenizer), scoring the
    prompt (echo with logprobs) and, for an upstream that is not a llama.cpp server, a grammar, ``ignore_eos`` and
    llama.cpp's sampling fields set to other than their defaults (at their defaults they are left out: the
    upstream's own sampler applies)."""
    p = msg.params
    if msg.embed is not None:
        return "embeddings are not relayed to remote members"
    if msg.infill is not None:
        return "fill-in-the-middle needs the model's own FIM tokens, which a remote member does not expose"
    if msg.tokenize_only:
        return "tokenizing needs the model's tokenizer, which a remote member does not expose"
    if p.prompt_logprobs:
        return "prompt logprobs (echo with logprobs) are not relayed to remote members"
    if member.llama_cpp:
        return None
    if p.grammar is not None:
        return ("a grammar (grammar, response_format json_schema/json_object, or forced tool calls) needs a "
                "llama.cpp upstream (set llama_cpp: true only for llamafleet or llama-server members)")
    if p.ignore_eos:
        return "ignore_eos needs a llama.cpp upstream"
    if changed := p.changed(LLAMA_CPP_KNOBS):
        return f"{', '.join(changed)} need a llama.cpp upstream; leave them at their defaults"
    return None
