"""The planner's answer: replicas, context sizes and the memory budget per device, with reasons in plain words."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from llamafleet.engine.types import SplitModeName

Device = Literal["gpu", "cpu"]


@dataclass(frozen=True, kw_only=True)
class ReplicaPlan:
    """One replica: its GPUs (NVML indices; empty on CPU), how the model is split over them, and the main GPU."""

    gpus: tuple[int, ...]
    split_mode: SplitModeName
    tensor_split: tuple[float, ...]  # one fraction per device (sum 1) when split, RPC devices first; () otherwise
    main_gpu: int  # NVML index; -1 on CPU
    rpc_servers: tuple[str, ...] = ()  # other hosts' RPC servers whose devices hold part of the layers
    n_gpu_layers: int | None = None  # layers offloaded (to GPUs and RPC devices); None = the config's n_gpu_layers

    @property
    def label(self) -> str:
        """Where it runs, for logs and reports: "CPU", "GPU 0", "GPUs 0,1" or "CPU + RPC 10.0.0.2:50052"."""
        local = f"GPU{'s' if len(self.gpus) > 1 else ''} {','.join(map(str, self.gpus))}" if self.gpus else "CPU"
        return local + "".join(f" + RPC {e}" for e in self.rpc_servers)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Memory of one device under the plan, in MiB. ``capacity_mib`` is free memory (None: unknown, unchecked)."""

    device: str  # "GPU 0", ... or "CPU"
    name: str
    replica: int | None  # which replica uses it; None = unused
    weights_mib: int
    kv_mib: int
    compute_mib: int
    margin_mib: int
    capacity_mib: int | None
    kv_tier_mib: int = 0  # host memory: the RAM tier of the KV cache, all replicas (engine/kv_tiers.py)

    @property
    def used_mib(self) -> int:
        return self.weights_mib + self.kv_mib + self.compute_mib + self.margin_mib + self.kv_tier_mib

    @property
    def overflow_mib(self) -> int:
        return 0 if self.capacity_mib is None else max(0, self.used_mib - self.capacity_mib)


@dataclass(frozen=True)
class Plan:
    """Where and how to run: replicas, context sizes, memory per device, and why, in plain words."""

    fits: bool
    device: Device
    replicas: tuple[ReplicaPlan, ...]
    n_ctx_per_seq: int
    n_seq: int
    n_batch: int
    n_ubatch: int
    kv_type: str
    flash_attn: bool | None
    budgets: tuple[Budget, ...]
    host_mib: int  # host memory per GPU replica (token embedding, logits); for CPU plans see budgets
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    model: str = ""
    kv_tier_mib: int = 0  # the RAM tier of the KV cache per replica (cache_ram_mib, or the size chosen for it)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["replicas"] = [
            {"gpus": list(r.gpus), "split_mode": r.split_mode, "tensor_split": list(r.tensor_split),
             "main_gpu": r.main_gpu,
             **({"rpc_servers": list(r.rpc_servers), "n_gpu_layers": r.n_gpu_layers} if r.rpc_servers else {})}
            for r in self.replicas
        ]
        d["budgets"] = [{**asdict(b), "used_mib": b.used_mib, "overflow_mib": b.overflow_mib} for b in self.budgets]
        d["reasons"], d["warnings"] = list(self.reasons), list(self.warnings)
        return d
