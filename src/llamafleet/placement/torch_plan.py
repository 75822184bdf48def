"""What the planner refuses for the engine a model needs: a checkpoint folder is the torch engine's, a GGUF file
llama.cpp's, and the torch engine takes none of llama.cpp's own placement knobs (the reason names each one asked for
and the fix). Everything else about a torch replica is planned as for GGUF: its bytes per device come from
:func:`~llamafleet.placement.memory.torch_needs`."""

from __future__ import annotations

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.memory import torch_dtype
from llamafleet.placement.plan import Plan


def torch_engine_note(model: ModelInfo, gpu: bool) -> str:
    """How the torch engine holds a replica's KV cache (and weights), for the plan's reasons."""
    return f"{torch_dtype(model, gpu)}, the weights' dtype (torch engine: no flash attention, no prefix cache)"


def torch_context(plan: Plan, cuda_graphs: bool) -> str:
    """What the torch engine does with a replica of ``plan``: its KV cache's dtype, its attention, its decode steps
    (CUDA graphs where a replica is on one GPU and ``cuda_graphs`` is auto: engine/pytorch/graphs.py)."""
    steps = ("eager (cuda_graphs: off)" if not cuda_graphs else "eager (on the CPU)" if plan.device != "gpu" else
             "eager (a layer split over several GPUs)" if any(len(r.gpus) > 1 for r in plan.replicas) else
             "replayed as CUDA graphs")
    return (f"n_batch {plan.n_batch}; KV cache {plan.kv_type}, the weights' dtype; attention by PyTorch over the "
            f"slots' KV buffers, no flash attention; decode steps {steps}")


def engine_refusal(model: ModelInfo, cfg: FleetConfig) -> str | None:
    """Why ``cfg`` cannot serve ``model`` with the engine it needs, if it cannot."""
    if cfg.engine not in ("auto", model.engine):
        kind = "a checkpoint folder" if model.engine == "torch" else "a GGUF file"
        other = "a GGUF file" if cfg.engine == "llama.cpp" else "a checkpoint folder"
        return (f"engine: {cfg.engine}, but {model.path} is {kind}, which the {model.engine} engine serves; set "
                f"engine: {model.engine} (or auto), or give {other}")
    if model.engine != "torch":
        return None
    asks = [(cfg.split_mode == "tensor", "split_mode: tensor (it splits layers over GPUs: use layer or auto)"),
            (cfg.kv_cache_type != "f16", f"kv_cache_type {cfg.kv_cache_type} (its KV cache is in the model's dtype: "
                                         "leave kv_cache_type unset)"),
            (bool(cfg.rpc_servers), "rpc_servers (llama.cpp's RPC backend)"),
            (cfg.n_gpu_layers not in (-1, 0), f"n_gpu_layers {cfg.n_gpu_layers} (all layers on GPUs, or 0 for the "
                                                "CPU)"),
            (cfg.speculative.mode != "off", "speculative decoding (speculative.mode: off)")]
    found = [what for used, what in asks if used]
    if not found:
        return None
    return ("a checkpoint folder is served by the torch engine, which does not take " + "; ".join(found)
            + "; convert the model to GGUF for the llama.cpp engine, or change those keys")
