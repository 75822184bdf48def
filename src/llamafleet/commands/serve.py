"""``llamafleet serve``: plan the model onto this machine, start one worker per replica, serve the OpenAI API.

Everything that can be refused is refused before any weights load: the configuration (unknown keys, wrong types),
the model file, a plan that does not fit (with the planner's reasons), a port already in use.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llamafleet.config import ConfigError, FleetConfig, inapplicable, load_config
from llamafleet.flags import add_config_flag, add_flags, overrides

if TYPE_CHECKING:
    from llamafleet.fleet.replicas import ReplicaSpec
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


def _banner(cfg: FleetConfig, model_name: str, n_replicas: int) -> str:
    url = _url(cfg)
    return "\n".join([
        f"llamafleet is serving '{model_name}' with {n_replicas} replica(s) at {url}",
        "  POST /v1/chat/completions   OpenAI chat completions (\"stream\": true for server-sent events)",
        "  POST /v1/completions        OpenAI text completions (a list of prompts is served as a batch)",
        "  POST /v1/responses          OpenAI Responses API (text)",
        "  POST /v1/messages           Anthropic Messages API (+ /v1/messages/count_tokens)",
        "  GET  /v1/models             the served model",
        "  POST /api/generate          {\"prompt\": ..., \"max_tokens\": ...} -> text and timings",
        "  GET  /health, /ready        liveness and readiness",
        "  GET  /metrics               Prometheus metrics",
        f"  {url}/ui   the dashboard and playground (GET /v1/status: its numbers as JSON)",
        f"  try: curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\",
        f"         -d '{{\"model\": \"{model_name}\", "
        '"messages": [{"role": "user", "content": "Hello!"}]}\'',
        "Press Ctrl-C to stop.",
    ])


def _replica_specs(cfg: FleetConfig, model_path: Path) -> tuple[Plan, list[ReplicaSpec]] | None:
    """Plan the model onto this machine: the plan and its replicas; None (after printing why) if it cannot fit."""
    from llamafleet.fleet.replicas import ReplicaSpec
    from llamafleet.model.header import read_model_info
    from llamafleet.placement.gpus import detect_inventory
    from llamafleet.placement.planner import launch_spec, make_plan

    inventory = detect_inventory()
    for line in inapplicable(cfg, inventory, os.cpu_count()):
        print(f"  warning: {line}", file=sys.stderr)
    plan = make_plan(read_model_info(model_path), inventory, cfg)
    out = sys.stdout if plan.fits else sys.stderr
    for reason in plan.reasons:
        print(f"  plan: {reason}", file=out)
    for warning in plan.warnings:
        print(f"  warning: {warning}", file=out)
    if not plan.fits:
        print(f"error: {model_path.name} does not fit this machine with this configuration; nothing was loaded.",
              file=sys.stderr)
        return None
    specs = []
    for i, replica in enumerate(plan.replicas):
        env, engine_cfg = launch_spec(plan, i, cfg, str(model_path))
        specs.append(ReplicaSpec(env, engine_cfg, replica.label, replica.gpus))
    return plan, specs


def run(args: argparse.Namespace) -> int:
    # Heavy modules (FastAPI, uvicorn, the fleet, the planner) load in here, when serve runs, so that building the
    # parser for another command never loads them.
    from llamafleet.api.middleware import ApiKeysError, load_api_keys
    from llamafleet.model.demo import ModelFetchError, default_model_path
    from llamafleet.model.header import GgufError

    try:
        cfg = load_config(args.config, overrides(args))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(cfg.log_level.upper())
    try:
        api_keys = load_api_keys(cfg.api_keys_file)
    except ApiKeysError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        model_path = Path(cfg.model_path) if cfg.model_path else default_model_path()
        if not model_path.is_file():
            raise GgufError(f"model file not found: {model_path} (check model_path / --model)")
        planned = _replica_specs(cfg, model_path)
    except (GgufError, ModelFetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if planned is None:
        return 1
    plan, specs = planned
    try:
        sock = _listen(cfg.host, cfg.port)
    except OSError as e:
        print(f"error: cannot listen on {cfg.host}:{cfg.port} ({e.strerror}); pass another --port", file=sys.stderr)
        return 1
    from llamafleet.api.app import run_server
    from llamafleet.api.service import Service
    from llamafleet.fleet.dispatch import Dispatcher
    from llamafleet.fleet.replicas import ReplicaSet
    from llamafleet.fleet.router import Router

    model_name = cfg.model_name or model_path.stem
    router = Router(len(specs), cfg.routing, cfg.max_queue_per_replica, cfg.max_queue)
    service = Service(Dispatcher(ReplicaSet(specs, cfg.log_level, cfg.heartbeat_timeout_s), router), model_name,
                      specs[0].engine.n_ctx_per_seq, cfg, api_keys, plan)
    if not api_keys and not _loopback(cfg.host):
        log.warning("listening on %s with no API key: anyone who can reach it can use it (set LLAMAFLEET_API_KEYS "
                    "or api_keys_file)", cfg.host)
    print(f"llamafleet: loading '{model_name}' as {len(specs)} replica(s), one at a time; "
          f"{_url(cfg)}/ready answers 200 once all are up", flush=True)
    return run_server(service, sock, cfg.log_level, lambda: print(_banner(cfg, model_name, len(specs)), flush=True))
