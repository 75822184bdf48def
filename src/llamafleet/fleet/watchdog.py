"""The watchdog: a periodic scan of GPU memory and of every replica's slot pool, in the API process (fleet
supervision beside :mod:`llamafleet.fleet.replicas`' heartbeats; the API reads what it found).

Every ``watchdog_interval_s`` it

* reads each GPU's memory and utilization through NVML (no NVML, e.g. a CPU machine: no GPU samples); a GPU above
  ``vram_warn_fraction`` of its memory is logged (once, when it crosses) and counted; a GPU with less than
  ``vram_refuse_free_mib`` free makes the server refuse new work with 503 until memory is back (running in-flight
  work to its end instead of running out of memory halfway);
* finds replicas whose slots leak: the worker reports busy slots or waiting sequences while the router knows of no
  sequence in flight there. If that lasts ``slot_leak_s``, the replica is restarted (its worker is killed and
  loaded again, as after a crash) and the recovery is counted.

Everything it sees is exported by ``GET /metrics`` (see :mod:`llamafleet.fleet.telemetry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from types import ModuleType

from llamafleet.config import FleetConfig
from llamafleet.fleet.models import ModelManager
from llamafleet.fleet.snapshot import ReplicaView, take
from llamafleet.fleet.telemetry import GpuSample
from llamafleet.placement.gpus import nvml_text

log = logging.getLogger(__name__)


class GpuMonitor:
    """NVML, opened once for the life of the server; :meth:`sample` reads every GPU."""

    def __init__(self) -> None:
        self._nv: ModuleType | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
        except Exception as e:  # no driver, no library: nothing to watch
            log.debug("NVML not available, GPU memory is not watched: %s", e)

    def sample(self) -> list[GpuSample]:
        nv = self._nv
        if nv is None:
            return []
        samples = []
        for i in range(int(nv.nvmlDeviceGetCount())):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                util: float | None = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except nv.NVMLError:  # not supported on every device (e.g. MIG instances)
                util = None
            samples.append(GpuSample(i, nvml_text(nv.nvmlDeviceGetName(h)), int(mem.used), int(mem.total), util))
        return samples

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None


def leaking(replicas: Iterable[ReplicaView], since: dict[str, float], now: float, leak_s: float) -> list[ReplicaView]:
    """Replicas whose slots have been busy with nothing in flight for ``leak_s``; ``since`` remembers when each
    such condition was first seen, by replica label (updated in place)."""
    found = []
    for r in replicas:
        idle_but_busy = (r.status == "ready" and r.stats is not None and (r.slots_busy or r.waiting) > 0
                         and r.outstanding == 0)
        if not idle_but_busy:
            since.pop(r.id, None)
            continue
        first = since.setdefault(r.id, now)
        if now - first >= leak_s:
            found.append(r)
            del since[r.id]
    return found


def fleet_gpus(replicas: Iterable[ReplicaView]) -> set[int]:
    """The GPUs (NVML indices) the replicas run on, as the plan placed them."""
    return {gpu for r in replicas for gpu in r.gpus}


def refusal(gpus: Iterable[GpuSample], ours: set[int], refuse_free_mib: int) -> str | None:
    """Why new work must be refused (a GPU of ours nearly full), or None. Other GPUs are someone else's business."""
    short = [g for g in gpus if g.index in ours and (g.total_bytes - g.used_bytes) < refuse_free_mib * 2**20]
    return ", ".join(f"GPU {g.index} has {(g.total_bytes - g.used_bytes) >> 20} MiB free "
                     f"(vram_refuse_free_mib {refuse_free_mib})" for g in short) or None


class Watchdog:
    """Scans on a timer while the server runs (see the module docstring); holds what the last scan found: the GPU
    samples, and why new work must be refused (``overloaded``; None: it need not)."""

    def __init__(self, models: ModelManager, cfg: FleetConfig, monitor: GpuMonitor | None = None) -> None:
        self.models = models
        self.cfg = cfg
        self.gpus: list[GpuSample] = []
        self.overloaded: str | None = None
        self._monitor = monitor  # opened when the watch starts (NVML stays closed for a service never run)
        self._leak_since: dict[str, float] = {}  # by replica label
        self._warned: set[int] = set()

    async def run(self) -> None:
        """Scan every ``watchdog_interval_s`` until cancelled."""
        try:
            while True:
                await self.scan()
                await asyncio.sleep(self.cfg.watchdog_interval_s)
        finally:
            if self._monitor is not None:
                self._monitor.close()

    async def scan(self) -> None:
        monitor = self._monitor = self._monitor or GpuMonitor()
        self.gpus = await asyncio.to_thread(monitor.sample)
        self._check_memory(self.gpus)
        self._check_slots()

    def _check_memory(self, gpus: list[GpuSample]) -> None:
        cfg, metrics = self.cfg, self.models.metrics
        for g in gpus:
            high = g.used_fraction >= cfg.vram_warn_fraction
            if high:
                metrics.vram_warnings.inc(str(g.index))
                if g.index not in self._warned:
                    log.warning("GPU %d (%s): %.0f%% of its memory is in use (warning watermark %.0f%%)", g.index,
                                g.name, 100 * g.used_fraction, 100 * cfg.vram_warn_fraction)
            (self._warned.add if high else self._warned.discard)(g.index)
        reason = refusal(gpus, fleet_gpus(take(self.models).replicas()), cfg.vram_refuse_free_mib)
        if reason != self.overloaded:
            if reason:
                log.error("refusing new work: %s", reason)
            else:
                log.warning("GPU memory is back above vram_refuse_free_mib; accepting new work again")
        self.overloaded = reason

    def _check_slots(self) -> None:
        leak_s = self.cfg.slot_leak_s
        for r in leaking(take(self.models).replicas(), self._leak_since, time.monotonic(), leak_s):
            log.error("replica %s: %s slot(s) busy and %s waiting with no request in flight for %.0fs; restarting it",
                      r.id, r.slots_busy, r.waiting, leak_s)
            self.models.metrics.recoveries.inc(r.id, "slot_leak")
            model = self.models.find(r.model)
            if model is not None and model.dispatcher is not None:
                model.dispatcher.replicas.recycle(r.index, "the watchdog found its slots leaking")
