"""``GET /props``: what llama-server's clients (its web UI, editor plugins, agents) read about the model they talk to,
in llama-server's shape, as far as each field is true here.

``?model=`` picks the model when several are served (the first configured one otherwise; it is loaded if it is not).
``default_generation_settings`` holds the context per sequence and the sampling a chat completion gets when the client
sets nothing; ``total_slots`` counts the sequence slots of every local replica of the model. The chat templates and
the BOS/EOS tokens' texts are read from the GGUF's header or the checkpoint folder's tokenizer config (once per
model). Fields that describe llama-server's own switches are answered as this server has them: no slot or props
endpoints, metrics on, no media, never asleep.
"""

from __future__ import annotations

import asyncio
import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import APIRouter

from llamafleet import __version__
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.service import ServiceDep
from llamafleet.api.tokens import model_service
from llamafleet.model.checkpoint import is_checkpoint, tokenizer_facts
from llamafleet.model.header import read_fields, read_header

routes = APIRouter()

# llama-server's names for the sampling fields this server has (the rest of its list is not built here)
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
                   "frequency_penalty", "ignore_eos")


@lru_cache(maxsize=16)
def template_facts(path: str) -> dict[str, str]:
    """The chat templates and the BOS and EOS tokens' texts of the GGUF or checkpoint folder at ``path`` ("" for what
    it has not)."""
    if is_checkpoint(path):
        return tokenizer_facts(Path(path))
    meta, _ = read_header(path)
    field = read_fields(path, "tokenizer.ggml.tokens").get("tokenizer.ggml.tokens")
    vocab = field.value if field is not None and isinstance(field.value, list) else []

    def token(key: str) -> str:
        i = meta.get(key)
        return str(vocab[i]) if isinstance(i, int) and 0 <= i < len(vocab) else ""

    facts = {"chat_template": str(meta.get("tokenizer.chat_template") or ""),
             "bos_token": token("tokenizer.ggml.bos_token_id"), "eos_token": token("tokenizer.ggml.eos_token_id")}
    if tool_use := meta.get("tokenizer.chat_template.tool_use"):
        facts["chat_template_tool_use"] = str(tool_use)
    return facts


def default_sampling(model: str) -> dict[str, Any]:
    """What a chat completion that sets nothing samples with, in llama-server's field names."""
    params = ChatCompletionRequest.model_validate({"model": model, "messages": [{"role": "user", "content": ""}]})
    sampling = dataclasses.asdict(params.sampling(None, 0, False))
    unlimited = sampling["max_tokens"] is None
    return {**{k: sampling[k] for k in SAMPLING_FIELDS if k in sampling},
            "n_predict": -1 if unlimited else sampling["max_tokens"],
            "max_tokens": -1 if unlimited else sampling["max_tokens"],
            "seed": -1 if sampling["seed"] is None else sampling["seed"], "stop": list(sampling["stop"]),
            "n_probs": 0, "stream": False, "grammar": ""}


@routes.get("/props")
async def props(service: ServiceDep, model: str | None = None) -> dict[str, Any]:
    service = await model_service(service, model)
    dispatcher = service.model.dispatcher
    local = [s.engine for s in (dispatcher.replicas.specs if dispatcher else []) if s.engine is not None]
    path = local[0].model_path if local else ""
    facts = await asyncio.to_thread(template_facts, path) if path else {}
    return {
        "default_generation_settings": {"n_ctx": service.n_ctx_per_seq,
                                        "params": default_sampling(service.model_name)},
        "total_slots": sum(e.n_seq for e in local),
        "model_alias": service.model_name,
        "model_path": path,
        "modalities": {"vision": False, "audio": False, "video": False},
        "endpoint_slots": False,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "chat_template": "",
        "bos_token": "",
        "eos_token": "",
        **facts,
        "build_info": f"llamafleet {__version__}",
        "is_sleeping": False,
    }
