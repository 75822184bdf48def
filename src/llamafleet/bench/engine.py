"""In-process engine benchmark: N requests one after another vs the same N at once, side by side in one run.

It answers two questions about the engine itself, without HTTP: how much of llama.cpp's batching gain the engine
keeps (aggregate generated tokens/s, concurrent / sequential), and what the Python loop costs per step next to
``llama_decode`` (overhead = step time - time in ``llama_decode`` and waiting for it; sampling shown apart). With the
engine's overlap on (the default) a GPU runs the next decode while Python detokenizes, so part of that overhead is
hidden rather than added to each step. Run it with ``llamafleet bench engine``.

With speculative decoding on in ``cfg``, each phase runs twice, in turn, in the same engine: with the requests
opted out of speculation and not, so the ratios compare runs made side by side under the same machine load. So that
neither side of a pair gets what the other paid for: the prefix cache is off (both sides send the same prompts, and
the second would otherwise find them computed by the first: 128 prompts prefilled by one side only made a GPU run's
pairs incomparable), the whole group runs once untimed before the first pair (a batch of that size is decoded
before any side is timed), and the order alternates (off first in the first pair, on first in the second ...).
``workload`` picks the prompts (:mod:`llamafleet.bench.workloads`; default: the short questions below).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from llamafleet.bench.workloads import Workload, workload_prompts
from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EngineConfig, Request, SamplingParams

if TYPE_CHECKING:
    from llamafleet.engine.pytorch.engine import TorchEngine

# The sequential phase measures a per-request rate, which does not depend on how many requests run: it stops here.
SEQUENTIAL_MAX = 8

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a refrigerator works.",
    "List some tips for learning a new language.",
    "Describe the water cycle to a child.",
    "What are the benefits of regular exercise?",
    "请介绍一下长城的历史。",
    "Summarize the plot of a detective novel.",
    "How do airplanes stay in the air?",
)


@dataclass
class Phase:
    name: str
    requests: int
    generated_tokens: int
    seconds: float
    steps: int
    decode_seconds: float
    sample_seconds: float
    step_seconds: float
    steady_tokens: int  # generated in steps where every request of its group produced a token
    steady_seconds: float
    drafted_tokens: int = 0  # speculative decoding: drafted and verified, and of those kept
    accepted_tokens: int = 0
    graph_steps: int = 0  # torch engine: decode steps replayed from CUDA graphs
    prefilled_tokens: int = 0  # prompt tokens computed (not taken from the prefix cache)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds else 0.0

    @property
    def steady_tokens_per_s(self) -> float:
        """Tokens/s of the steps in which every sequence generated (no prefill, no ramp): the counterpart of
        llama-batched-bench's S_TG and of ``llamafleet bench``'s steady_tok_s."""
        return self.steady_tokens / self.steady_seconds if self.steady_seconds else 0.0

    @property
    def overhead_share(self) -> float:
        """Share of step time spent outside llama_decode (batch build, sampling, detokenizing, bookkeeping)."""
        return 1.0 - self.decode_seconds / self.step_seconds if self.step_seconds else 0.0

    @property
    def overhead_ms_per_step(self) -> float:
        return 1000.0 * (self.step_seconds - self.decode_seconds) / self.steps if self.steps else 0.0

    @property
    def sample_ms_per_step(self) -> float:
        return 1000.0 * self.sample_seconds / self.steps if self.steps else 0.0


def _phase(eng: Engine | TorchEngine, name: str, batches: list[list[Request]]) -> Phase:
    """Run each group of requests together to its end, one group after another."""
    before = eng.stats()
    t0 = time.perf_counter()
    gen = steady = 0
    steady_s = 0.0
    for group in batches:
        for r in group:
            eng.add_request(r)
        while eng.has_work():
            t = time.perf_counter()
            outs = eng.step()
            dt = time.perf_counter() - t
            tokens = sum(len(o.token_ids) for o in outs)
            gen += tokens
            if len({o.request_id for o in outs if o.token_ids}) == len(group):
                steady, steady_s = steady + tokens, steady_s + dt
    secs = time.perf_counter() - t0
    after = eng.stats()
    return Phase(name, sum(len(b) for b in batches), gen, secs, after.steps - before.steps,
                 after.decode_seconds_total - before.decode_seconds_total,
                 after.sample_seconds_total - before.sample_seconds_total,
                 after.step_seconds_total - before.step_seconds_total, steady, steady_s,
                 after.draft_tokens_total - before.draft_tokens_total,
                 after.draft_accepted_total - before.draft_accepted_total,
                 after.graph_steps_total - before.graph_steps_total,
                 after.prompt_tokens_total - before.prompt_tokens_total)


def prompt_texts(workload: Workload | None, n: int) -> list[str]:
    """The first ``n`` prompts of ``workload`` (None: the built-in short questions)."""
    if workload is None:
        return [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    prompts = workload_prompts(workload)
    return [prompts.get(i).text for i in range(n)]


def _engine(cfg: EngineConfig) -> Engine | TorchEngine:
    """The engine ``cfg`` names: llama.cpp's, or the torch engine for a checkpoint folder (the torch extra)."""
    if cfg.engine == "torch":
        from llamafleet.engine.pytorch.engine import TorchEngine

        return TorchEngine(cfg)
    return Engine(cfg)


def run(cfg: EngineConfig, n_requests: int = 8, max_tokens: int = 64,
        workload: Workload | None = None, repeat: int = 1) -> dict[str, object]:
    """Measure sequential vs concurrent generation of ``n_requests`` greedy answers of ``max_tokens`` tokens (and,
    with speculative decoding on, each with and without it, ``repeat`` times in turn: the ratio is the median of
    the pairs', so a shared machine's swings hit both sides of each pair alike)."""
    texts = prompt_texts(workload, n_requests)
    compare = cfg.speculative.on
    orders = [(False, True) if i % 2 == 0 else (True, False) for i in range(repeat)] if compare else [(False,)] * repeat
    if compare:
        cfg = replace(cfg, prefix_cache=False)
    with _engine(cfg) as eng:
        def reqs(tag: str, spec: bool = False, tokens: int = max_tokens) -> list[Request]:
            params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, speculative=spec)
            return [Request(f"{tag}{i}", tuple(eng.tokenize(t)), params) for i, t in enumerate(texts)]
        eng.generate(reqs("warm")[:1])  # warm-up: first-touch of weights and buffers
        if compare and n_requests > 1:  # and the whole group's batch shapes, before either side of a pair is timed
            eng.generate(reqs("warmall", tokens=2))
        phases = [_phase(eng, f"sequential{'+spec' if spec else ''}", [[r] for r in reqs(f"s{i}{spec}", spec)
                                                                      [:SEQUENTIAL_MAX]])
                  for i, order in enumerate(orders) for spec in order]
        phases += [_phase(eng, f"concurrent{'+spec' if spec else ''}", [reqs(f"c{i}{spec}", spec)])
                   for i, order in enumerate(orders) for spec in order]
    seq, conc = phases[0], phases[len(phases) // 2]
    result: dict[str, object] = {
        "model": cfg.model_path.rsplit("/", 1)[-1],
        "workload": workload or "questions",
        "threads": cfg.n_threads,
        "gpu_layers": cfg.n_gpu_layers,
        "overlap": cfg.overlap,
        "backend_sampling": cfg.backend_sampling,
        "cuda_graphs": cfg.cuda_graphs if cfg.engine == "torch" else None,
        "speculative": asdict(cfg.speculative) | {"draft_model": cfg.speculative.draft_model and
                                                  cfg.speculative.draft_model.rsplit("/", 1)[-1]},
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "phases": [asdict(p) | {"tokens_per_s": p.tokens_per_s, "overhead_share": p.overhead_share,
                                "overhead_ms_per_step": p.overhead_ms_per_step,
                                "sample_ms_per_step": p.sample_ms_per_step,
                                "steady_tokens_per_s": p.steady_tokens_per_s} for p in phases],
        "speedup": conc.tokens_per_s / seq.tokens_per_s if seq.tokens_per_s else 0.0,
    }
    if compare:  # tokens/s with speculation / without, per pair of phases run one after the other
        pairs: dict[str, list[float]] = {"sequential": [], "concurrent": []}
        for a, b in zip(phases[0::2], phases[1::2], strict=True):
            off, on = (b, a) if a.name.endswith("+spec") else (a, b)
            pairs[off.name].append(on.tokens_per_s / off.tokens_per_s if off.tokens_per_s else 0.0)
        result["speculative_speedup"] = {name: statistics.median(r) for name, r in pairs.items()}
        result["speculative_speedup_pairs"] = pairs
        result["pair_order"] = ["off, on" if order[0] is False else "on, off" for order in orders]
    return result


def markdown(result: dict[str, object]) -> str:
    rows = ["| phase | requests | generated tok | seconds | tok/s | steady tok/s | steps | Python overhead / step "
            "| share | of which sampling |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in result["phases"]:  # type: ignore[attr-defined]
        rows.append(f"| {p['name']} | {p['requests']} | {p['generated_tokens']} | {p['seconds']:.2f} | "
                    f"{p['tokens_per_s']:.1f} | {p['steady_tokens_per_s']:.1f} | {p['steps']} | "
                    f"{p['overhead_ms_per_step']:.3f} ms | "
                    f"{100 * p['overhead_share']:.1f}% | {p['sample_ms_per_step']:.3f} ms |")
    rows.append(f"\nconcurrent / sequential aggregate tokens/s: **{result['speedup']:.2f}x**")
    if result.get("cuda_graphs") is not None:
        graphed = [f"{p['name']} {p['graph_steps']} of {p['steps']}" for p in result["phases"]]  # type: ignore[attr-defined]
        rows.append("decode steps replayed from CUDA graphs: " + ", ".join(graphed))
    for name, ratio in dict(result.get("speculative_speedup") or {}).items():  # type: ignore[call-overload]
        rows.append(f"{name}: speculative / off tokens/s: **{ratio:.2f}x**")
    return "\n".join(rows)


def to_json(result: dict[str, object]) -> str:
    return json.dumps(result, indent=2)
