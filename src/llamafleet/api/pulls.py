"""Models pulled from the Hugging Face hub into a running server's ``models_dir`` (``POST /admin/models/pull``).

A pull is refused before anything is downloaded when the reference is malformed or names no model, when the model
cannot fit this machine even alone (the planner's reasons, from its header read off the hub), or when the disk would
fill. Then the download runs in a thread, its progress (bytes, rate, ETA) in ``/v1/models`` and the log; once whole
and checked, its files are linked into ``models_dir`` (a split model's parts side by side) and the model joins the
fleet, unloaded: it loads on its first request, placed like the others, and after a restart it is one of the folder's
files. A failed pull stays listed, ``failed`` with its error, until the name is pulled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llamafleet.catalog import folder_model
from llamafleet.fleet.models import ManagedModel, ModelManager
from llamafleet.model.header import ModelInfo
from llamafleet.model.hub import Resolved, fetch
from llamafleet.model.progress import LogProgress
from llamafleet.placement.packing import Demand, fix_shape, residual

log = logging.getLogger(__name__)


class PullRefused(ValueError):
    """A pull that cannot start; ``status`` is the HTTP status that says why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Pull:
    """One model on its way from the hub."""

    name: str
    ref: str
    total: int  # bytes to download
    state: str = "downloading"  # or "failed"
    done: float = 0.0
    started: float = field(default_factory=time.monotonic)
    error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def add(self, n: float) -> None:
        self.done += n

    @property
    def rate(self) -> float | None:
        """Bytes per second since it started."""
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 and self.done > 0 else None

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        return max(0.0, (self.total - self.done) / rate) if rate else None


class Pulls:
    """The pulls of one server, by model name."""

    def __init__(self) -> None:
        self.active: dict[str, Pull] = {}

    def start(self, models: ModelManager, resolved: Resolved, model: ModelInfo, name: str) -> Pull:
        """Check that ``model`` (its header, read off the hub) can be served under ``name``, then download it in
        the background; :class:`PullRefused` if not."""
        cfg = models.cfg
        if cfg.models_dir is None:
            raise PullRefused(409, "no_models_dir", "this server has no models_dir to pull into; start it with "
                              "--models-dir (or models_dir in its config)")
        if models.find(name) is not None or (name in self.active and self.active[name].state != "failed"):
            raise PullRefused(409, "model_exists", f"the fleet already has a model named '{name}'; pull it under "
                              "another name (\"name\")")
        assert models.inventory is not None
        served = folder_model(cfg, name, Path(model.path))
        pinned = [m.placed for m in models.models if m.pinned and m.placed is not None]
        plan, fixed = fix_shape(model, residual(models.inventory, pinned), served.cfg)  # as at start
        if not plan.fits:
            raise PullRefused(409, "model_does_not_fit", f"{resolved.ref} does not fit this machine beside its "
                              "pinned models; nothing was downloaded: " + "; ".join(plan.reasons))
        pull = Pull(name, str(resolved.ref), sum(f.size for f in resolved.missing()))
        entry = ManagedModel(name, aliases=(), pinned=False, idle_ttl_s=served.idle_ttl_s,
                             n_ctx_per_seq=plan.n_ctx_per_seq, demand=Demand(name, model, fixed, False))
        pull.task = asyncio.get_running_loop().create_task(self._run(pull, models, resolved, entry))
        self.active[name] = pull
        return pull

    async def _run(self, pull: Pull, models: ModelManager, resolved: Resolved, entry: ManagedModel) -> None:
        try:
            await _in_daemon_thread(lambda: fetch(resolved, LogProgress.feeding(pull.add)), f"pull-{pull.name}")
            assert models.cfg.models_dir is not None and entry.demand is not None
            first = _link(resolved, Path(models.cfg.models_dir))
            entry.demand = dataclasses.replace(entry.demand, model=dataclasses.replace(entry.demand.model,
                                                                                       path=str(first)))
            models.add(entry)
        except Exception as e:
            pull.state, pull.error = "failed", str(e)
            log.error("pull of %s as '%s' failed: %s", pull.ref, pull.name, e)
            return
        del self.active[pull.name]
        log.info("pulled %s as model '%s' (%s): it loads on its first request", pull.ref, pull.name, first)


async def _in_daemon_thread(work: Callable[[], object], name: str) -> None:
    """Run ``work`` in a daemon thread (an executor's thread would hold the server's exit until a 40 GB download
    ends; a daemon one dies with it, leaving the library's partial file behind)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(None)

    def run() -> None:
        error: BaseException | None = None
        try:
            work()
        except BaseException as e:  # handed to the awaiting task, which records it
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    await done


def _link(resolved: Resolved, folder: Path) -> Path:
    """Links in ``folder`` to the cached files (a split model's parts by their own names); the first one's path."""
    links = []
    for f in resolved.files:
        link = folder / Path(f.name).name
        if not link.exists():
            link.symlink_to(resolved.snapshot / f.name)
        links.append(link)
    return links[0]
