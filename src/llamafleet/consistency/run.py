"""Running the consistency check: the configurations, their workers, and the report.

Every configuration runs in real worker processes (:class:`~llamafleet.fleet.replicas.ReplicaSet` over
:func:`~llamafleet.fleet.worker.worker_main`), exactly the path ``llamafleet serve`` takes: the worker tokenizes the
chat prompt through the model's template, the engine generates greedily with log-probabilities, outputs come back once
per step. Starting each configuration in a fresh process also means its environment (``CUDA_VISIBLE_DEVICES``) is set
before llama.cpp loads, and its memory is given back in full before the next one loads.

Configurations (``--configs``):

* ``reference``: one sequence at a time, ``n_batch`` as given. Always runs first; the others are compared to it.
* ``batched``: the same prompts with ``concurrency`` sequences decoding together in one engine.
* ``nbatch-<k>``: one sequence at a time with ``n_batch = k`` (prompts are decoded in chunks of k, at most
  ``prefill_tokens``).
* ``replica-<i>``: replica i of a set of ``max(i) + 1`` replicas loaded together, as a fleet would be; each
  replica answers the prompts one at a time, one replica after another (so CPU replicas never compete for cores).
* ``layer`` / ``tensor``: one replica whose weights are split over every GPU by layer or by tensor. GPU only.
* ``gguf``: for a checkpoint folder (the torch engine), the same weights converted to an F16 GGUF
  (:mod:`llamafleet.model.convert_hf`) on the llama.cpp engine, one sequence at a time: the two engines compared.

Placement comes from the planner (:func:`~llamafleet.placement.planner.make_plan` and
:func:`~llamafleet.fleet.specs.plan_specs`), as for ``serve``: on GPUs the reference and its single-replica
variants go where the planner puts one replica (the main GPU), replicas one per GPU, splits over every selected GPU. The
GPU splits are skipped, with the reason, where fewer than two GPUs can be used (no GPU, or a CPU-only build of
llama.cpp). Every worker gets the same thread count.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from llamafleet.config import FleetConfig
from llamafleet.consistency.compare import Answer, Thresholds, compare_all, judge, summarize
from llamafleet.consistency.prompts import Prompt
from llamafleet.consistency.report import ConfigResult, Report
from llamafleet.engine.cores import default_threads
from llamafleet.engine.types import EngineConfig, Generation, SamplingParams
from llamafleet.fleet.launch import ReplicaSpec
from llamafleet.fleet.messages import Ready, StepOutputs, Submit
from llamafleet.fleet.replicas import ReplicaSet
from llamafleet.fleet.specs import plan_specs
from llamafleet.model.checkpoint import describe
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory, empty_inventory
from llamafleet.placement.planner import make_plan

log = logging.getLogger(__name__)

GPU_ONLY = ("layer", "tensor")
DEFAULT_CONFIGS = ("reference", "batched", "nbatch-16", "replica-0", "replica-1", "layer", "tensor")
_NAME = re.compile(r"^(reference|batched|layer|tensor|gguf|nbatch-[1-9][0-9]*|replica-[0-9]+)$")
STOP_TIMEOUT_S = 30.0


class ConfigNameError(ValueError):
    """A ``--configs`` entry that is not a known configuration."""


def parse_configs(text: str) -> tuple[str, ...]:
    """Comma-separated configuration names -> a tuple that starts with ``reference``, without repeats."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not _NAME.match(n):
            raise ConfigNameError(
                f"--configs: unknown configuration {n!r}; use reference, batched, nbatch-<k> (k >= 1), "
                "replica-<i> (i >= 0), layer, tensor or gguf"
            )
    return tuple(dict.fromkeys(["reference", *names]))


@dataclass(frozen=True)
class CheckOptions:
    """What the run compares and with what settings.

    ``fleet`` carries the settings every configuration shares (context length, ``batch_size`` of the reference,
    threads, KV cache type, flash attention, which GPUs, ``split_ratio`` for the splits); each configuration then
    changes only its own variable (slots, ``n_batch``, placement).
    """

    fleet: FleetConfig
    model_path: str
    configs: tuple[str, ...] = DEFAULT_CONFIGS
    max_tokens: int = 64
    concurrency: int = 8
    gguf: str | None = None  # ``gguf``'s file: the checkpoint folder's weights as an F16 GGUF

    def __post_init__(self) -> None:
        if self.configs[:1] != ("reference",) or not all(_NAME.match(n) for n in self.configs):
            raise ValueError(f"configs must start with 'reference' and use known names, got {self.configs}")
        if self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError("max_tokens and concurrency must be >= 1")


@dataclass(frozen=True)
class Setup:
    """Configurations whose workers are loaded together, one per replica, and how many prompts each runs at once."""

    names: tuple[str, ...]
    specs: tuple[ReplicaSpec, ...]
    concurrency: int


def threads_per_worker(cfg: FleetConfig) -> int:
    """The CPU threads every worker gets: the same for all, so thread count is never what differs."""
    return cfg.threads or default_threads()


def usable_inventory(inventory: Inventory, gpu_build: Callable[[], bool]) -> Inventory:
    """``inventory``, or none when llama.cpp cannot offload (``gpu_build`` is only asked when there are GPUs)."""
    if inventory.gpus and not gpu_build():
        return empty_inventory(f"{len(inventory.gpus)} GPU(s) found, but the installed llama.cpp is a CPU-only "
                               "build (reinstall it with CUDA, see scripts/install.sh)")
    return inventory


def describe_device(inventory: Inventory) -> str:
    """Where the check runs, for the report: "CPU (no GPU found)" or "2 x NVIDIA H200 (nvlink)"."""
    if not inventory.gpus:
        return f"CPU ({inventory.note or 'no GPU'})"
    names = sorted({g.name for g in inventory.gpus})
    links = sorted({k for row in inventory.links for k in row if k != "self"})
    return f"{len(inventory.gpus)} x {' / '.join(names)}" + (f" ({', '.join(links)})" if links else "")


def place(opts: CheckOptions, model: ModelInfo, inventory: Inventory, kind: str, n: int, n_seq: int,
          n_batch: int, path: str | None = None) -> list[ReplicaSpec] | str:
    """The planner's placement of ``n`` replicas of ``kind`` ("single", "replicas", "layer", "tensor"), or why not."""
    selected = [g for g in inventory.gpus if opts.fleet.gpus is None or g.index in opts.fleet.gpus]
    if kind in GPU_ONLY and len(selected) < 2:
        why = (inventory.note or "no GPU found") if not inventory.gpus else f"only {len(selected)} GPU selected"
        return f"{kind} split runs over 2 or more GPUs; skipped here ({why})"
    split = kind if kind in GPU_ONLY else "none"
    cfg = FleetConfig.model_validate({
        **opts.fleet.model_dump(), "split_mode": split, "replicas": n, "parallel": n_seq, "batch_size": n_batch,
        "prefill_tokens": min(n_batch, opts.fleet.prefill_tokens), "ubatch_size": None,
        "threads": threads_per_worker(opts.fleet),
        "split_ratio": opts.fleet.split_ratio if split != "none" else None,
    })
    plan = make_plan(model, inventory, cfg)
    if not plan.fits:
        return "the planner cannot place it here: " + "; ".join(plan.reasons)
    return plan_specs(plan, cfg, path or opts.model_path)


def setups(opts: CheckOptions, model: ModelInfo, inventory: Inventory) -> tuple[list[Setup], list[ConfigResult]]:
    """Group the chosen configurations into setups; those that cannot run here come back as skipped results."""
    out: list[Setup] = []
    skipped: list[ConfigResult] = []
    batch = opts.fleet.batch_size

    def add(names: tuple[str, ...], kind: str, n: int, concurrency: int, n_seq: int = 1, n_batch: int = batch,
            other: ModelInfo | None = None) -> None:
        specs = place(opts, other or model, inventory, kind, n, n_seq, n_batch, None if other is None else other.path)
        if isinstance(specs, str):
            skipped.extend(ConfigResult(name, "skipped", note=specs) for name in names)
        else:
            out.append(Setup(names, tuple(specs), concurrency))

    replicas = [n for n in opts.configs if n.startswith("replica-")]
    for name in opts.configs:
        if name == "reference":
            add((name,), "single", 1, 1)
        elif name == "batched":
            add((name,), "single", 1, opts.concurrency, n_seq=opts.concurrency)
        elif name.startswith("nbatch-"):
            add((name,), "single", 1, 1, n_batch=int(name.split("-")[1]))
        elif name in GPU_ONLY:
            add((name,), name, 1, 1)
        elif name == "gguf":
            if opts.gguf is None:
                skipped.append(ConfigResult(name, "skipped", note="gguf compares a checkpoint folder on the torch "
                                            "engine with its weights on llama.cpp; this model is a GGUF file"))
            else:
                add((name,), "single", 1, 1, other=describe(opts.gguf))
        elif name == replicas[0]:  # every replica in one set, loaded together as a fleet would be
            count = 1 + max(int(n.split("-")[1]) for n in replicas)
            add(tuple(f"replica-{i}" for i in range(count)), "replicas", count, 1)
    return out, skipped


class _Collector:
    """The replica set's listener: gathers each request's outputs into a :class:`Generation` and resolves it."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int, Generation, asyncio.Future[Generation]]] = {}
        self.pids: dict[int, int] = {}  # replica -> its worker's pid

    def expect(self, replica: int, request_id: str) -> asyncio.Future[Generation]:
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (replica, Generation(request_id), fut)
        return fut

    def _fail(self, request_id: str, why: str) -> None:
        entry = self._pending.pop(request_id, None)
        if entry is not None and not entry[2].done():
            entry[2].set_exception(RuntimeError(why))

    def replica_up(self, replica: int, ready: Ready) -> None:
        self.pids[replica] = ready.pid

    def replica_down(self, replica: int, reason: str) -> None:
        for rid in [rid for rid, (r, _, _) in self._pending.items() if r == replica]:
            self._fail(rid, reason)

    def replica_suspect(self, replica: int, suspect: bool) -> None:
        pass  # each replica answers its own prompts: there is nowhere else to send them

    def replica_output(self, replica: int, msg: StepOutputs) -> None:
        for rej in msg.rejected:
            self._fail(rej.request_id, f"the worker refused the prompt: {rej.message}")
        for out in msg.outputs:
            entry = self._pending.get(out.request_id)
            if entry is None:
                continue
            entry[1].add(out)
            if out.finish_reason in ("error", "cancelled"):
                self._fail(out.request_id, out.error or f"generation ended with {out.finish_reason}")
            elif out.finished:
                del self._pending[out.request_id]
                entry[2].set_result(entry[1])


async def _answers(rs: ReplicaSet, col: _Collector, replica: int, prompts: list[Prompt], params: SamplingParams,
                   concurrency: int) -> list[Answer]:
    """Every prompt's answer from ``replica``, at most ``concurrency`` in flight; in prompt order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(k: int, prompt: Prompt) -> Answer:
        async with gate:
            rid = f"r{replica}-p{k}"
            fut = col.expect(replica, rid)
            rs.send(replica, Submit(rid, params, chat=prompt.chat))
            c = await fut
        return Answer(tuple(c.token_ids), tuple(c.logprobs), c.text, c.finish_reason)

    tasks = [asyncio.create_task(one(k, p)) for k, p in enumerate(prompts)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:  # after a failure: stop waiting for the rest
            t.cancel()


async def _run_setup(setup: Setup, prompts: list[Prompt], opts: CheckOptions
                     ) -> list[tuple[ConfigResult, list[Answer] | None]]:
    """Load ``setup``'s workers, collect every replica's answers, stop the workers. Failures become errors."""
    params = SamplingParams(max_tokens=opts.max_tokens, temperature=0.0, logprobs=True)
    col = _Collector()
    rs = ReplicaSet(list(setup.specs), opts.fleet.log_level, opts.fleet.heartbeat_timeout_s)
    results = [ConfigResult(name, "error", spec.label, engine=_engine_facts(spec.model_engine))
               for name, spec in zip(setup.names, setup.specs, strict=True)]
    answers: list[list[Answer]] = []
    try:
        await rs.start(col)
        for i, res in enumerate(results):
            t0 = time.perf_counter()
            answers.append(await _answers(rs, col, i, prompts, params, setup.concurrency))
            res.seconds, res.pid = time.perf_counter() - t0, col.pids.get(i)
    except RuntimeError as e:  # LoadError, or a request the worker refused, failed or lost when it died
        for res in results[len(answers):]:
            res.note = str(e)
    finally:
        await rs.stop(STOP_TIMEOUT_S)
    return [(res, answers[i] if i < len(answers) else None) for i, res in enumerate(results)]


def _engine_facts(cfg: EngineConfig) -> dict[str, object]:
    facts: dict[str, object] = {"n_seq": cfg.n_seq, "n_batch": cfg.n_batch, "n_ubatch": cfg.n_ubatch,
                                "split_mode": cfg.split_mode, "n_gpu_layers": cfg.n_gpu_layers,
                                "flash_attn": "auto" if cfg.flash_attn is None else cfg.flash_attn,
                                "kv_type": cfg.kv_cache_type, "n_threads": cfg.n_threads}
    if cfg.tensor_split:
        facts["tensor_split"] = list(cfg.tensor_split)
    return facts


def _judged(res: ConfigResult, ref: list[Answer], answers: list[Answer], limits: Thresholds) -> ConfigResult:
    res.comparisons = compare_all(ref, answers)
    res.summary = summarize(res.comparisons)
    res.failures = judge(res.summary, limits)
    res.status = "fail" if res.failures else "pass"
    res.diverged_texts = {c.prompt: answers[c.prompt].text for c in res.comparisons if not c.exact}
    return res


def run_check(opts: CheckOptions, prompts: list[Prompt], model: ModelInfo, inventory: Inventory, limits: Thresholds,
              progress: Callable[[str], None] = log.info) -> Report:
    """Run every chosen configuration (the reference first) and compare each with the reference."""
    planned, skipped = setups(opts, model, inventory)
    done: dict[str, ConfigResult] = {r.name: r for r in skipped}
    ref: list[Answer] | None = None
    for setup in planned:
        if "reference" not in setup.names and ref is None:
            done.update({n: ConfigResult(n, "error", note="not run: the reference did not run") for n in setup.names})
            continue
        where = ", ".join(dict.fromkeys(s.label for s in setup.specs))
        progress(f"running {', '.join(setup.names)} on {where} ({len(prompts)} prompts)")
        for res, answers in asyncio.run(_run_setup(setup, prompts, opts)):
            if answers is None:
                done[res.name] = res
            elif res.name == "reference":
                res.status, ref = "reference", answers
                done[res.name] = res
            else:
                assert ref is not None
                done[res.name] = _judged(res, ref, answers, limits)
            progress(f"  {res.name}: {done[res.name].status}")
    f = opts.fleet
    settings = (f"flash attention {'auto' if f.flash_attn is None else 'on' if f.flash_attn else 'off'}, KV cache "
                f"{f.kv_cache_type}, {threads_per_worker(f)} thread(s) per worker, context {f.context_length} per "
                "sequence")
    return Report(os.path.basename(opts.model_path), describe_device(inventory), opts.max_tokens, limits, prompts,
                  [done[n] for n in opts.configs if n in done], [a.text for a in ref or []], settings)
