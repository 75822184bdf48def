"""A plan being drawn up, as both planners build it: the notes it collects, the LoRA adapters folded into the
model's weights, candidate replicas with balanced split ratios, and the finished
:class:`~llamafleet.placement.plan.Plan` record.

:mod:`llamafleet.placement.planner` (this host's devices) and :mod:`llamafleet.placement.rpc_plan` (with other hosts'
devices) both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llamafleet.config import FleetConfig
from llamafleet.engine.types import SplitModeName
from llamafleet.model.adapter import read_adapter_info
from llamafleet.model.header import GgufError, ModelInfo
from llamafleet.placement.advice import mib
from llamafleet.placement.gpus import Gpu
from llamafleet.placement.memory import MIB, ContextShape, DeviceNeed, replica_needs, torch_dtype, with_weights
from llamafleet.placement.plan import Budget, Device, Plan, ReplicaPlan


@dataclass
class Notes:
    """What a plan says in words as it is drawn up; ``refused`` once a rule (not memory) rules it out."""

    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refused: bool = False

    def refuse(self, reason: str) -> None:
        self.reasons.append(reason)
        self.refused = True


@dataclass(frozen=True)
class Candidate:
    """A candidate replica: GPUs, mode, ratios and what each GPU would need."""

    gpus: tuple[Gpu, ...]
    mode: SplitModeName
    ratios: tuple[float, ...]
    needs: tuple[DeviceNeed, ...]

    def overflows(self, margin: int) -> list[tuple[Gpu, int]]:
        return [(g, n.total + margin - g.free_mib * MIB) for g, n in zip(self.gpus, self.needs, strict=True)
                if n.total + margin > g.free_mib * MIB]


def to_plan(*, model: ModelInfo, ctx: ContextShape, cfg: FleetConfig, notes: Notes, device: Device, fits: bool = False,
            replicas: tuple[ReplicaPlan, ...] = (), budgets: tuple[Budget, ...] = (), host: int = 0) -> Plan:
    """The plan of ``model`` in shape ``ctx`` with ``notes``' reasons (``host`` bytes of host memory); left at the
    defaults, a refused one."""
    torch = model.engine == "torch"  # its KV cache in the weights' dtype, its attention not llama.cpp's
    return Plan(fits=fits, device=device, replicas=replicas, n_ctx_per_seq=ctx.n_ctx_per_seq, n_seq=ctx.n_seq,
                n_batch=ctx.n_batch, n_ubatch=ctx.n_ubatch,
                kv_type=torch_dtype(model, device == "gpu") if torch else ctx.kv_type,
                flash_attn=False if torch else cfg.flash_attn,
                budgets=budgets, host_mib=mib(host), reasons=tuple(notes.reasons), warnings=tuple(notes.warnings),
                model=cfg.served_name(model.path))


def normalize(shares: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    """Shares as fractions that sum to 1 (rounded to 4 places, as ``tensor_split`` is shown)."""
    total = sum(shares)
    return tuple(round(s / total, 4) for s in shares)


def balance(model: ModelInfo, members: tuple[Gpu, ...], mode: SplitModeName, cfg: FleetConfig,
            ctx: ContextShape) -> Candidate:
    """Ratios proportional to what each GPU can hold for the parts that scale with the ratio (layers, KV).

    Whole layers (and whole KV heads under tensor split) can still tip one GPU over; its share is then lowered by
    the overflow and the ratios recomputed, a few times at most. The least-overflowing attempt is returned.
    """
    free = [g.free_mib * MIB - cfg.vram_margin_mib * MIB for g in members]
    even = replica_needs(model, ctx, mode, normalize([1.0] * len(members)), cfg.n_gpu_layers)[0]
    head = [model.output_bytes if mode == "layer" and i == len(members) - 1 else 0 for i in range(len(members))]
    room = [f - n.compute - h for f, n, h in zip(free, even, head, strict=True)]
    best: Candidate | None = None
    best_over = 0
    for _ in range(4 * len(members) + 8):
        ratios = normalize([max(r, 1) for r in room])
        needs = replica_needs(model, ctx, mode, ratios, cfg.n_gpu_layers)[0]
        over = [n.total - f for n, f in zip(needs, free, strict=True)]
        if best is None or max(over) < best_over:
            best, best_over = Candidate(members, mode, ratios, needs), max(over)
        if max(over) <= 0:
            break
        room = [r - max(o, 0) - (MIB if o > 0 else 0) for r, o in zip(room, over, strict=True)]
    assert best is not None
    return best


def with_adapters(model: ModelInfo, cfg: FleetConfig, notes: Notes) -> ModelInfo:
    """``model`` with the LoRA adapters of ``cfg`` folded in: llama.cpp loads each adapter's tensors beside the
    weights they adapt, on the same devices, so their bytes (what their files hold) are spread evenly over the
    layers. An adapter that is not one, or adapts another architecture, refuses the plan with the reason."""
    total = 0
    for i, entry in enumerate(cfg.lora):
        try:
            total += read_adapter_info(entry.path, model.architecture).tensor_bytes
        except (GgufError, OSError) as e:
            notes.refuse(f"lora[{i}] ({entry.adapter_name}): {e}; give a LoRA adapter GGUF of this model")
            return model
    if model.engine == "torch":
        notes.refuse("lora: adapters are served by the llama.cpp engine (a GGUF model), not the torch engine")
        return model
    notes.reasons.append(f"{len(cfg.lora)} LoRA adapter{'s' * (len(cfg.lora) > 1)} ({-(-total // MIB)} MiB of "
                         "tensors, their files' size) beside the weights in each replica: counted with them")
    return with_weights(model, total)
