"""Remote members: a replica that is another OpenAI-compatible server (another llamafleet, a llama-server, a provider).

The design: a remote member is a replica like any other, only its worker process loads no model. Its replica spec
has no engine and a launcher of its own, :class:`MemberLauncher`, which starts
:func:`llamafleet.fleet.remote_worker.remote_main` as a child process (whatever starts the model's other replicas:
a member relays from this host). That worker speaks the same pipe protocol as a llama.cpp worker
(:mod:`llamafleet.fleet.messages`): ``Ready`` once the upstream answers, one ``StepOutputs`` per relayed chunk,
heartbeats, and an exit when the upstream stops answering. So everything above the pipe works unchanged and counts
members exactly as it counts local replicas: the replica set's supervision (death noticed at once, restart with
backoff, which is how an unreachable upstream is re-probed), the router (a member's slots are its
``max_concurrency``), the dispatcher, metrics, aggregation and every API route. The alternative, relaying in the API
process itself, would have needed a second path through dispatch, health and metrics for the same outcomes.

This module holds what the API process needs to know of a member: the configured members (:func:`members`, each
key read from the environment or a file, never printed), their replica specs (:func:`member_specs`) and what a
member cannot relay (:func:`unrelayable`, a spec's ``refuses``: the dispatcher routes such a request only to
replicas that can serve it, or refuses it with 400 before routing). Who a member is
(:class:`~llamafleet.fleet.relay.RemoteMember`) and the HTTP side are in :mod:`llamafleet.fleet.relay` and
:mod:`llamafleet.fleet.remote_worker`.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from llamafleet.config import ConfigError, FleetConfig
from llamafleet.config_sections import RemoteEntry
from llamafleet.engine.types import LLAMA_CPP_KNOBS
from llamafleet.fleet.launch import Launched, ReplicaSpec, spawn
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.relay import RemoteMember
from llamafleet.fleet.remote_worker import remote_main
from llamafleet.openai_wire import root_url

NO_CONTEXT_LIMIT = 2**31 - 1  # a member's context is the upstream's business; it refuses what does not fit (400)


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
    return [RemoteMember(url=root_url(e.url), model=e.model, max_concurrency=e.max_concurrency, timeout_s=e.timeout_s,
                         llama_cpp=e.llama_cpp, api_key=_read_key(e, f"{where}[{i}]")) for i, e in enumerate(entries)]


def remote_context(cfg: FleetConfig) -> int:
    """The context per sequence of a model served by remote members only: the upstream's (it refuses what does not
    fit), unless ``context_length`` is set to refuse too-long requests here first."""
    return cfg.context_length if "context_length" in cfg.model_fields_set else NO_CONTEXT_LIMIT


class MemberLauncher:
    """Starts a member's relay (:func:`~llamafleet.fleet.remote_worker.remote_main`) as a child process of this one,
    with ``n_ctx_per_seq`` as the context it reports (the model's, or :data:`NO_CONTEXT_LIMIT`)."""

    def __init__(self, member: RemoteMember, n_ctx_per_seq: int) -> None:
        self.member, self.n_ctx_per_seq = member, n_ctx_per_seq

    async def launch(self, replica: int, spec: ReplicaSpec, log_level: str, beat_s: float) -> Launched:
        return spawn(remote_main, replica, spec.label, spec.env, self.member, self.n_ctx_per_seq, log_level, beat_s)


def member_specs(remote: list[RemoteMember], n_ctx_per_seq: int, prefix: str = "") -> list[ReplicaSpec]:
    """A replica spec per member (``prefix`` starts its label, e.g. the model's name): no engine, its own launcher,
    and what it cannot relay."""
    return [ReplicaSpec(env={}, engine=None, label=f"{prefix}{m.label}", launcher=MemberLauncher(m, n_ctx_per_seq),
                        refuses=partial(unrelayable, member=m)) for m in remote]


def unrelayable(msg: Submit, member: RemoteMember) -> str | None:
    """Why ``member`` cannot serve ``msg`` as asked, worded for the client; None if it can.

    What this relay does not carry: embeddings, reranking and LoRA adapters (they go to local replicas). What an
    OpenAI-compatible upstream cannot express: tokenizing and fill-in-the-middle (they need the model's tokenizer),
    scoring the prompt (echo with logprobs) and, for an upstream that is not a llama.cpp server, a grammar,
    ``ignore_eos`` and llama.cpp's sampling fields set to other than their defaults (at their defaults they are left
    out: the upstream's own sampler applies)."""
    p = msg.params
    if msg.embed is not None:
        return "embeddings are not relayed to remote members"
    if msg.rerank is not None:
        return "reranking is not relayed to remote members"
    if msg.infill is not None:
        return "fill-in-the-middle needs the model's own FIM tokens, which a remote member does not expose"
    if msg.tokenize_only:
        return "tokenizing needs the model's tokenizer, which a remote member does not expose"
    if p.prompt_logprobs:
        return "prompt logprobs (echo with logprobs) are not relayed to remote members"
    if p.lora:
        return "LoRA adapters are applied by this server's own replicas, not relayed to remote members"
    if p.think_budget is not None and (msg.chat is None or not member.llama_cpp):
        return "a reasoning budget is relayed with chats to llamafleet members only (set llama_cpp: true)"
    if member.llama_cpp:
        return None
    if p.grammar is not None:
        return ("a grammar (grammar, response_format json_schema/json_object, or forced tool calls) needs a "
                "llama.cpp upstream (set llama_cpp: true only for llamafleet or llama-server members)")
    if p.ignore_eos:
        return "ignore_eos needs a llama.cpp upstream"
    if changed := p.changed((*LLAMA_CPP_KNOBS, "penalty_last_n")):
        return f"{', '.join(changed)} need a llama.cpp upstream; leave them at their defaults"
    return None
