"""What GPUs this machine has (or a described machine has): memory per GPU and the link between each pair.

:func:`detect_inventory` asks NVML (``nvidia-ml-py``) and never raises: without a driver or GPU it returns an empty
inventory whose ``note`` says why, and the planner then plans for the CPU. :func:`load_inventory` reads the same
facts from a YAML file, so a user can plan for a server they do not have yet and tests can describe any machine::

    gpus:
      - {name: NVIDIA H200, total_mib: 143771, free_mib: 143000}
      - {name: NVIDIA H200, total_mib: 143771, free_mib: 143000}
    interconnect: nvlink          # nvlink | pcie: the link between every pair
    links:                        # optional per-pair matrix; overrides interconnect
      - [self, nvlink]
      - [nvlink, self]
    host_mem_mib: 515000          # optional: RAM available, checked by CPU plans

GPU indices are NVML's, which follow PCI bus order; workers are started with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so
CUDA numbers the devices the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamafleet.config import describe_errors, read_yaml

log = logging.getLogger(__name__)

LinkKind = Literal["self", "nvlink", "pcie"]
LINK_KINDS: tuple[str, ...] = ("self", "nvlink", "pcie")


class InventoryError(ValueError):
    """An inventory file that cannot be used, worded for the person who wrote it."""


@dataclass(frozen=True)
class Gpu:
    """One GPU: its index (NVML / PCI bus order), model name and memory in MiB."""

    index: int
    name: str
    total_mib: int
    free_mib: int
    uuid: str | None = None


@dataclass(frozen=True)
class RemoteDevice:
    """A device of another host behind llama.cpp's RPC server at ``endpoint`` (its ``device``-th), with the memory the
    server reports and the round trip measured when it was asked (:mod:`llamafleet.placement.rpc_probe`)."""

    endpoint: str
    device: int
    total_mib: int
    free_mib: int
    rtt_ms: float | None = None

    @property
    def label(self) -> str:
        return f"RPC {self.endpoint}#{self.device}"


@dataclass(frozen=True)
class Inventory:
    """The GPUs of one machine and how each pair is connected (``links[i][j]`` is self, nvlink or pcie)."""

    gpus: tuple[Gpu, ...]
    links: tuple[tuple[str, ...], ...]
    source: str  # "nvml", "file:<name>" or "none"
    note: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    host_mem_mib: int | None = None  # RAM available for a CPU plan (MemAvailable); None = unknown, not checked
    rpc: tuple[RemoteDevice, ...] = ()  # other hosts' devices (rpc_servers), in the order llama.cpp will use them

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise ValueError(f"links must be a {n}x{n} matrix, one row and column per GPU")
        for i, row in enumerate(self.links):
            for j, kind in enumerate(row):
                if kind not in LINK_KINDS:
                    raise ValueError(f"links[{i}][{j}] is {kind!r}; use one of {', '.join(LINK_KINDS)}")
                if (i == j) != (kind == "self"):
                    raise ValueError(f"links[{i}][{j}] is {kind!r}; 'self' belongs exactly on the diagonal")
                if self.links[j][i] != kind:
                    raise ValueError(f"links[{i}][{j}] ({kind}) differs from links[{j}][{i}] ({self.links[j][i]})")

    def link(self, i: int, j: int) -> str:
        """The link between the GPUs at positions ``i`` and ``j`` of :attr:`gpus`."""
        return self.links[i][j]

    def position(self, gpu_index: int) -> int:
        """Where the GPU with NVML index ``gpu_index`` sits in :attr:`gpus`."""
        for pos, gpu in enumerate(self.gpus):
            if gpu.index == gpu_index:
                return pos
        known = ", ".join(str(g.index) for g in self.gpus) or "none"
        raise KeyError(f"GPU {gpu_index} is not in the inventory (GPUs: {known})")

    def all_linked(self, gpu_indices: tuple[int, ...], kind: str) -> bool:
        """True when every distinct pair among ``gpu_indices`` is connected by ``kind``."""
        pos = [self.position(g) for g in gpu_indices]
        return all(self.links[a][b] == kind for a in pos for b in pos if a != b)


def uniform_links(n: int, kind: str) -> tuple[tuple[str, ...], ...]:
    """An ``n``x``n`` link matrix with ``kind`` between every pair."""
    return tuple(tuple("self" if i == j else kind for j in range(n)) for i in range(n))


def host_available_mib() -> int | None:
    """RAM the kernel says is available to new work (``MemAvailable``), in MiB; None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError) as e:
        log.debug("cannot read /proc/meminfo: %s", e)
    return None


def empty_inventory(note: str) -> Inventory:
    """No GPU: the planner will plan for the CPU; ``note`` says why."""
    return Inventory(gpus=(), links=(), source="none", note=note, host_mem_mib=host_available_mib())


def nvml_text(value: str | bytes) -> str:
    """NVML returns bytes from older bindings, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else value


def detect_inventory() -> Inventory:
    """Ask NVML for every GPU and the links between them. Never raises: problems become an empty inventory's note."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - a declared dependency
        return empty_inventory(f"nvidia-ml-py is not installed ({e}); install it to detect GPUs")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError subclasses for a missing library/driver, or OSError
        return empty_inventory(f"NVML not available: {e}")
    try:
        return _read_nvml(pynvml)
    except Exception as e:
        log.warning("reading GPUs through NVML failed: %s", e)
        return empty_inventory(f"NVML query failed: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as e:  # shutting down cannot change the answer
            log.debug("nvmlShutdown failed: %s", e)


def _read_nvml(nv: Any) -> Inventory:
    count = int(nv.nvmlDeviceGetCount())
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus = []
    for i, h in enumerate(handles):
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        gpus.append(
            Gpu(
                index=i,
                name=nvml_text(nv.nvmlDeviceGetName(h)),
                total_mib=int(mem.total) // 2**20,
                free_mib=int(mem.free) // 2**20,
                uuid=nvml_text(nv.nvmlDeviceGetUUID(h)),
            )
        )
    links = [["self" if i == j else "pcie" for j in range(count)] for i in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            try:
                status = nv.nvmlDeviceGetP2PStatus(handles[i], handles[j], nv.NVML_P2P_CAPS_INDEX_NVLINK)
            except Exception as e:  # older drivers: treat as PCIe, the safe assumption
                log.debug("P2P status of GPUs %d and %d unknown: %s", i, j, e)
                status = None
            if status == nv.NVML_P2P_STATUS_OK:
                links[i][j] = links[j][i] = "nvlink"
    driver = cuda = None
    try:
        driver = nvml_text(nv.nvmlSystemGetDriverVersion())
        v = int(nv.nvmlSystemGetCudaDriverVersion())
        cuda = f"{v // 1000}.{v % 1000 // 10}"
    except Exception as e:
        log.debug("driver version unknown: %s", e)
    note = None if gpus else "NVML found no GPU"
    return Inventory(
        gpus=tuple(gpus),
        links=tuple(tuple(r) for r in links),
        source="nvml",
        note=note,
        driver_version=driver,
        cuda_driver_version=cuda,
        host_mem_mib=host_available_mib(),
    )


class _GpuEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "GPU"
    total_mib: int = Field(gt=0)
    free_mib: int | None = Field(None, ge=0, description="default: total_mib")
    index: int | None = Field(None, ge=0, description="default: position in the list")
    uuid: str | None = None


class _InventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[_GpuEntry]
    interconnect: Literal["nvlink", "pcie"] = "pcie"
    links: list[list[LinkKind]] | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    host_mem_mib: int | None = Field(None, gt=0, description="RAM available for a CPU plan")


def load_inventory(path: str | Path) -> Inventory:
    """Read an inventory file (see the module docstring for its form); errors name the key and the fix."""
    p = Path(path)
    raw = read_yaml(p, "inventory", InventoryError)
    if not isinstance(raw, dict):
        raise InventoryError(f"{p} must be a mapping with a 'gpus' list, e.g. gpus: [{{total_mib: 24576}}]")
    try:
        spec = _InventoryFile.model_validate(raw)
    except ValidationError as e:
        raise InventoryError(describe_errors(e, f"invalid inventory in {p}:")) from None
    gpus = []
    for pos, g in enumerate(spec.gpus):
        free = g.total_mib if g.free_mib is None else g.free_mib
        if free > g.total_mib:
            raise InventoryError(f"{p}: gpus[{pos}].free_mib ({free}) exceeds total_mib ({g.total_mib})")
        idx = pos if g.index is None else g.index
        gpus.append(Gpu(index=idx, name=g.name, total_mib=g.total_mib, free_mib=free, uuid=g.uuid))
    if len({g.index for g in gpus}) != len(gpus):
        raise InventoryError(f"{p}: two GPUs share an index; give each a distinct 'index' or leave them out")
    links = uniform_links(len(gpus), spec.interconnect) if spec.links is None else tuple(map(tuple, spec.links))
    try:
        return Inventory(
            gpus=tuple(gpus),
            links=links,
            source=f"file:{p.name}",
            note=None if gpus else f"{p.name} lists no GPU",
            driver_version=spec.driver_version,
            cuda_driver_version=spec.cuda_driver_version,
            host_mem_mib=spec.host_mem_mib,
        )
    except ValueError as e:
        raise InventoryError(f"{p}: {e}") from None


def describe_inventory(inv: Inventory) -> str:
    """A few readable lines: one per GPU, then the links if there is more than one GPU."""
    remote = [f"  {d.label}: {d.total_mib} MiB total, {d.free_mib} MiB free"
              + (f", {d.rtt_ms:.2f} ms round trip" if d.rtt_ms is not None else "") for d in inv.rpc]
    if not inv.gpus:
        return "\n".join([f"no GPU ({inv.note or inv.source}); planning for the CPU", *remote])
    lines = [f"{len(inv.gpus)} GPU(s) from {inv.source}:"]
    for g in inv.gpus:
        lines.append(f"  GPU {g.index}: {g.name}, {g.total_mib} MiB total, {g.free_mib} MiB free")
    if len(inv.gpus) > 1:
        kinds = {inv.links[i][j] for i in range(len(inv.gpus)) for j in range(len(inv.gpus)) if i != j}
        lines.append(f"  links: {', '.join(sorted(kinds))}")
    return "\n".join([*lines, *remote])
