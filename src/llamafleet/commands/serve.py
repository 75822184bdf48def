"""``llamafleet serve``: plan the model onto this machine, start one worker per replica, serve the OpenAI API.

Everything that can be refused is refused before any weights load: the configuration (unknown keys, wrong types),
the model file, a plan that does not fit (with the planner's reasons), a port already in use. A model named on the
hub (``hf:ORG/REPO:QUANT``) is planned from its header alone and downloaded only once its plan fits. With several models
(``models:`` or ``--models-dir``) the whole fleet is placed first (as ``llamafleet plan`` shows it); the pinned
models load at start, the others on their first request (:mod:`llamafleet.fleet.models`).
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llamafleet.config import ConfigError, FleetConfig, load_config
from llamafleet.exits import Exit
from llamafleet.flags import add_config_flag, add_flags, overrides

if TYPE_CHECKING:
    from llamafleet.fleet.launch import ReplicaSpec
    from llamafleet.fleet.models import ManagedModel
    from llamafleet.fleet.ray_cluster import RayFleet
    from llamafleet.fleet.telemetry import FleetMetrics
    from llamafleet.model.header import ModelInfo
    from llamafleet.model.hub import Resolved
    from llamafleet.placement.gpus import Inventory
    from llamafleet.placement.plan import Plan

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a GGUF model behind an OpenAI-compatible API (default: the demo model on 127.0.0.1:8080)",
        description="Serve a GGUF model on every GPU of this machine (or the CPU) behind an OpenAI-compatible "
        "HTTP API. Flags override the --config file.",
    )
    add_config_flag(p)
    add_flags(p, "serve")
    p.add_argument("--inventory", metavar="FILE", help="place the models as if on the GPUs described in this YAML "
                   "(see examples/inventories/), not on the ones NVML finds: for trying a placement out; the workers "
                   "still run on what the machine has")
    p.set_defaults(func=run)


def _listen(host: str, port: int) -> socket.socket:
    """Bind before loading anything, so a busy port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _url(cfg: FleetConfig) -> str:
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    return f"http://{host}:{cfg.port}"


def _banner(cfg: FleetConfig, model_name: str, what: str) -> str:
    url = _url(cfg)
    return "\n".join([
        f"llamafleet is serving {what} at {url}",
        "  POST /v1/chat/completions   OpenAI chat completions (\"stream\": true for server-sent events)",
        "  POST /v1/completions        OpenAI text completions (a list of prompts is served as a batch)",
        "  POST /v1/responses          OpenAI Responses API (text)",
        "  POST /v1/messages           Anthropic Messages API (+ /v1/messages/count_tokens)",
        "  GET  /v1/models             the served models, their state and placement",
        "  POST /api/generate          {\"prompt\": ..., \"max_tokens\": ...} -> text and timings",
        "  GET  /health, /ready        liveness and readiness",
        "  GET  /metrics               Prometheus metrics",
        f"  {url}/ui   the dashboard and playground (GET /v1/status: its numbers as JSON)",
        f"  try: curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\",
        f"         -d '{{\"model\": \"{model_name}\", "
        '"messages": [{"role": "user", "content": "Hello!"}]}\'',
        "Press Ctrl-C to stop.",
    ])


def _replica_specs(cfg: FleetConfig, model: ModelInfo, hub: Resolved | None,
                   inventory: Inventory) -> tuple[Plan, list[ReplicaSpec]] | None:
    """Plan the model onto this machine (a hub model from its header alone, fetched once the plan fits): the plan
    and its replicas; None (after printing why) if it cannot fit."""
    from llamafleet.fleet.specs import plan_specs
    from llamafleet.placement.planner import make_plan

    plan = make_plan(model, inventory, cfg)
    out = sys.stdout if plan.fits else sys.stderr
    for reason in plan.reasons:
        print(f"  plan: {reason}", file=out)
    for warning in plan.warnings:
        print(f"  warning: {warning}", file=out)
    if not plan.fits:
        print(f"error: {hub.ref if hub else Path(model.path).name} does not fit this machine with this configuration; "
              f"nothing was {'downloaded' if hub and hub.missing() else 'loaded'}.", file=sys.stderr)
        return None
    if hub is not None:
        _fetch([hub])
    return plan, plan_specs(plan, cfg, model.path)


def _fetch(models: list[Resolved]) -> None:
    """Download the hub models the cache lacks (after their plan fits), with progress in the log."""
    from llamafleet.model.hub import cache_root, fetch, gib
    from llamafleet.model.progress import LogProgress

    for hub in models:
        need = sum(f.size for f in hub.missing())
        if need:
            print(f"llamafleet: downloading {hub.ref} ({gib(need)}) into the hub cache {cache_root()}", flush=True)
        fetch(hub, LogProgress)


def _ray_fleet(cfg: FleetConfig, model_path: Path) -> RayFleet | None:
    """Join the Ray cluster and plan the model on each of its nodes; None (after printing why) if no node can run a
    replica. Needs the ``ray`` extra (``pip install llamafleet[ray]``)."""
    try:
        from llamafleet.fleet.ray_cluster import connect, ray_fleet
    except ImportError as e:
        raise ConfigError(f"ray: Ray is not installed ({e}); install it with `pip install llamafleet[ray]`, or leave "
                          "--ray / ray unset") from None
    from llamafleet.model.checkpoint import describe

    assert cfg.ray is not None
    connect(cfg.ray, cfg.log_level)
    fleet = ray_fleet(describe(model_path), cfg, str(model_path))
    out = sys.stdout if fleet.plan.fits else sys.stderr
    for node in fleet.plan.nodes:
        print(f"  plan: node {node.node.address}: {len(node.plan.replicas)} replica(s) on "
              f"{', '.join(r.label for r in node.plan.replicas)}", file=out)
    for note in fleet.plan.notes:
        print(f"  plan: {note}", file=out)
    if not fleet.plan.fits:
        print(f"error: no node of the Ray cluster can run {model_path.name} with this configuration; nothing was "
              "loaded.", file=sys.stderr)
        return None
    return fleet


def _fleet_models(cfg: FleetConfig, inventory: Inventory, metrics: FleetMetrics) -> list[ManagedModel] | None:
    """Place several models (printing the placement); None (after printing why) if the fleet cannot be served."""
    from llamafleet.catalog import demands, served_models
    from llamafleet.commands.plan import fleet_json, format_fleet
    from llamafleet.fleet.models import ManagedModel, remote_only, replica_prefix
    from llamafleet.fleet.remote import members
    from llamafleet.model.demo import default_model_path
    from llamafleet.model.header import GgufError
    from llamafleet.placement.packing import pack

    served = served_models(cfg, default_model_path)
    for m in served:
        if m.path is not None and m.hub is None and not m.path.exists():
            raise GgufError(f"model file not found: {m.path} (check the path of model '{m.name}')")
    packing, fixed = pack(demands(served), inventory)
    report = format_fleet(fleet_json(packing, fixed, served, inventory, cfg.vram_margin_mib), inventory)
    print("\n".join(f"  {line}" for line in report.splitlines()), file=sys.stdout if packing.fits else sys.stderr)
    if not packing.fits:
        print("error: these models cannot all be served on this machine; nothing was loaded.", file=sys.stderr)
        return None
    _fetch([m.hub for m in served if m.hub is not None])
    demand = {d.name: d for d in fixed}
    models = []
    for m in served:
        remote = members(list(m.remote), f"models[{m.name}].remote")
        if m.path is None:
            models.append(remote_only(m.name, m.aliases, remote, m.cfg, metrics,
                                      replica_prefix(m.name, len(served) > 1)))
        else:
            models.append(ManagedModel(m.name, aliases=m.aliases, pinned=m.pinned, idle_ttl_s=m.idle_ttl_s,
                                       n_ctx_per_seq=packing.shapes[m.name].n_ctx_per_seq, demand=demand[m.name],
                                       remote=remote))
    return models


def _one_model(cfg: FleetConfig, inventory: Inventory, metrics: FleetMetrics) -> list[ManagedModel] | None:
    """Plan the one model (printing why): a pinned model placed now; None if it does not fit."""
    from llamafleet.catalog import fetched_extras
    from llamafleet.fleet.models import placed_model
    from llamafleet.fleet.remote import member_specs, members, remote_context
    from llamafleet.model.demo import default_model_path
    from llamafleet.model.header import GgufError
    from llamafleet.model.hub import model_header
    from llamafleet.model.hub_ref import is_ref

    remote, launcher, cfg = members(cfg.remote), None, fetched_extras(cfg)
    if remote and cfg.model_path is None:  # remote members only: nothing loads here
        model_name = cfg.model_name or remote[0].model
        if model_name is None:
            raise ConfigError("model_name: a fleet of remote members only has no file to name its model after; set "
                              "model_name (--model-name) or the first member's model")
        n_ctx, specs, plan = remote_context(cfg), [], None
    else:
        source = cfg.model_path or default_model_path()
        if not is_ref(str(source)) and not Path(source).exists():
            raise GgufError(f"model file not found: {source} (check model_path / --model)")
        model, hub = model_header(source)
        if cfg.ray is not None:  # planned per node: the dashboard shows what each node measures, not one plan
            if hub is not None:
                _fetch([hub])
            ray_fleet = _ray_fleet(cfg, Path(model.path))
            if ray_fleet is None:
                return None
            plan, local, launcher = None, ray_fleet.specs, ray_fleet.launcher
        else:
            planned = _replica_specs(cfg, model, hub, inventory)
            if planned is None:
                return None
            plan, local = planned
        model_name, n_ctx, specs = cfg.served_name(model.path), local[0].model_engine.n_ctx_per_seq, local
    specs += member_specs(remote, n_ctx)
    return [placed_model(model_name, specs, n_ctx, cfg, metrics, plan=plan, launcher=launcher)]


def run(args: argparse.Namespace) -> int:
    # Heavy modules (FastAPI, uvicorn, the fleet, the planner) load in here, when serve runs, so that building the
    # parser for another command never loads them.
    from llamafleet.api.service import Service
    from llamafleet.fleet.models import ModelManager
    from llamafleet.fleet.telemetry import FleetMetrics
    from llamafleet.model.demo import ModelFetchError
    from llamafleet.model.header import GgufError
    from llamafleet.model.hub import HubError
    from llamafleet.model.hub_ref import RefError
    from llamafleet.placement.advice import inapplicable
    from llamafleet.placement.gpus import InventoryError, detect_inventory, load_inventory
    from llamafleet.placement.rpc_probe import with_rpc
    from llamafleet.tenants.keys import ApiKeysError, load_keyring

    try:
        cfg = load_config(args.config, overrides(args))
        inventory = with_rpc(load_inventory(args.inventory) if args.inventory else detect_inventory(),
                             cfg.rpc_servers)
    except (ConfigError, InventoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    logging.getLogger().setLevel(cfg.log_level.upper())
    try:
        keys_files = (cfg.api_keys_file, cfg.admin_api_keys_file)
        keys = load_keyring(*keys_files)
    except ApiKeysError as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    for line in inapplicable(cfg, inventory, None if args.inventory else os.cpu_count()):
        print(f"  warning: {line}", file=sys.stderr)
    several, metrics = cfg.models is not None or cfg.models_dir is not None, FleetMetrics()
    try:
        served = (_fleet_models if several else _one_model)(cfg, inventory, metrics)
    except (ConfigError, RefError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    except (GgufError, ModelFetchError, HubError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.MODEL
    if served is None:  # the plan does not fit (said above)
        return Exit.NO
    service = Service(ModelManager(served, cfg, metrics, inventory), keys, keys_files)
    try:
        sock = _listen(cfg.host, cfg.port)
    except OSError as e:
        print(f"error: cannot listen on {cfg.host}:{cfg.port} ({e.strerror}); pass another --port", file=sys.stderr)
        return Exit.MACHINE
    from llamafleet.api.app import run_server

    if keys.open and not _loopback(cfg.host):
        log.warning("listening on %s with no API key: anyone who can reach it can use it (set LLAMAFLEET_API_KEYS "
                    "or api_keys_file)", cfg.host)
    models = service.models.models
    if several:
        pinned = [m.name for m in models if m.pinned]
        what = f"{len(models)} models ({', '.join(m.name for m in models)})"
        print(f"llamafleet: loading the pinned models ({', '.join(pinned) or 'none'}), one replica at a time; the "
              f"others load on their first request; {_url(cfg)}/ready answers 200 once the pinned ones are up",
              flush=True)
    else:
        n = len(service.snapshot().replicas())
        what = f"'{service.model_name}' with {n} replica(s)"
        print(f"llamafleet: loading '{service.model_name}' as {n} replica(s), one at a time; "
              f"{_url(cfg)}/ready answers 200 once all are up", flush=True)
    failed = run_server(service, sock, cfg.log_level,
                        lambda: print(_banner(cfg, service.model_name, what), flush=True))
    gc.freeze()  # the process exits next: its last collection of the whole heap took a second and more, for nothing
    return Exit.LOAD if failed else Exit.OK
