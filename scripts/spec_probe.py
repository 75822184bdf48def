"""What limits speculative decoding on this machine and model: the cost of a verification pass, and what prompt
lookup could gain on a workload.

    python scripts/spec_probe.py passes [MODEL.gguf] [--threads N] [--ngl N]
    python scripts/spec_probe.py replay [MODEL.gguf] [--workload edit] [--requests 6] [--max-tokens 192] [--chat]
    python scripts/spec_probe.py price [MODEL.gguf] --answers REPLAY.json --passes PASSES.json [--max-draft 8]

``passes``: one sequence at position 800 decodes passes of 1, 2, 3, 5, 9 and 17 tokens with logits at each (a
verification of 0..16 drafts), through the engine's bindings. Each size runs ``--reps`` times in a row ("steady":
on a GPU, llama.cpp's CUDA graph for that shape is captured and reused) and alternating with one-token passes
("alternating": the shape changes every pass, as when drafts come and go, which makes llama.cpp run without its graph
and capture it again). Medians in ms, and each size's cost over the one-token pass: a drafted token's cost ``c`` is
(ratio - 1) / drafts; the alternating ratio is the median of each pair's (a one-token pass, then the size), which a
shared machine's swings hit alike.

``replay``: the model's greedy answers (speculation off) to the workload's prompts are recorded, then prompt lookup
and the engine's per-sequence policy (engine/speculative/) are replayed over them for drafted tokens costing
``c`` of a one-token pass each (``--costs``): tokens per pass, drafts kept, and the speedup ``tokens / sum(1 + c *
drafts)`` the engine would get if passes cost exactly that. Beside it, an oracle bound: at each step the earlier
occurrence of the last ``n`` tokens whose continuation matches the answer longest, drafting exactly the run it keeps
(no rejected draft; copied from earlier positions only, so a loop drafted on past the sequence's end can beat it).
``lookup_us`` is the host time of one lookup.

``price``: a replay's recorded answers (one machine's, e.g. the demo model's on a CPU) replayed with another device's
measured passes (``passes``' JSON from a GPU): each pass at its steady time when the pass before it had the same
size and at its alternating time otherwise, under the engine's rule (``engine_rule``), the same with every pass at
its steady time (``steady_only``: what size changes cost), and with every drafting step padded to ``max_draft``
tokens so that passes keep one size (``padded_to_one_size``). ``speedup``: tokens over the passes' time in
one-token passes; ``size_changes``: the share of passes whose size differs from the one before.

JSON on stdout; the numbers are in docs/BENCHMARKS.md ("Speculative decoding: what limits it", and "GPU: speculative
decoding, where a step's time goes").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# isort: off
import llamafleet.engine.llama as L  # llama.cpp before numpy, or a CUDA build can crash (see engine/llama.py)
import numpy as np
# isort: on

from llamafleet.bench.engine import prompt_texts
from llamafleet.bench.workloads import WORKLOADS, Workload
from llamafleet.engine.engine import Engine
from llamafleet.engine.speculative.policy import Track
from llamafleet.engine.speculative.source import NgramIndex
from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

SIZES = (1, 2, 3, 5, 9, 17)
AT = 800  # the position the passes decode at (an edit prompt and part of its answer)


def passes(model: str, threads: int | None, ngl: int, reps: int) -> dict[str, object]:
    cfg = EngineConfig(model_path=model, n_seq=1, n_ctx_per_seq=2048, n_batch=512, n_ubatch=512, flash_attn=True,
                       n_threads=threads, n_gpu_layers=ngl)
    rng = np.random.default_rng(0)
    with L.Model(cfg) as m, L.Context(m, cfg) as c, L.Batch(512) as b:
        def run(n: int) -> float:
            b.token[:n] = rng.integers(0, m.n_vocab, n)
            b.pos[:n], b.seq[:n], b.logits[:n], b.n_tokens = np.arange(AT, AT + n), 0, 1, n
            t0 = time.perf_counter()
            assert c.launch(b) == 0
            c.wait()
            c.logits(n)
            t = time.perf_counter() - t0
            c.keep_prefix(0, AT)
            return t

        for start in range(0, AT, 400):  # the prompt before the passes, in two chunks
            b.token[:400] = rng.integers(0, m.n_vocab, 400)
            b.pos[:400], b.seq[:400], b.logits[:400], b.n_tokens = np.arange(start, start + 400), 0, 0, 400
            assert c.launch(b) == 0
            c.wait()
        steady = {n: statistics.median([run(n) for _ in range(reps)][reps // 2:]) for n in SIZES}
        pairs: dict[int, list[tuple[float, float]]] = {n: [] for n in SIZES[1:]}
        for _ in range(reps):
            for n in SIZES[1:]:
                pairs[n].append((run(1), run(n)))
    one = steady[1]
    paired = {n: statistics.median(b / a for a, b in p) for n, p in pairs.items()}
    return {"model": model.rsplit("/", 1)[-1], "threads": threads, "gpu_layers": ngl, "position": AT,
            "steady_ms": {n: 1e3 * t for n, t in steady.items()},
            "steady_ratio": {n: t / one for n, t in steady.items()},
            "alternating_ms": {n: 1e3 * statistics.median(b for _, b in p) for n, p in pairs.items()},
            "alternating_ratio": paired,
            "drafted_token_cost_steady": {n: (steady[n] / one - 1) / (n - 1) for n in SIZES[1:]},
            "drafted_token_cost_paired": {n: (paired[n] - 1) / (n - 1) for n in SIZES[1:]}}


def record(model: str, workload: Workload, n: int, max_tokens: int, threads: int | None,
           chat: bool = False) -> list[tuple[list[int], list[int]]]:
    """Greedy answers (speculation off) to the first ``n`` prompts (as a user message in the model's chat template
    with ``chat``; else as a completion, as the benches send them): (prompt tokens, answer tokens) each."""
    cfg = EngineConfig(model_path=model, n_seq=1, n_ctx_per_seq=2048, n_threads=threads)
    out = []
    with Engine(cfg) as eng:
        for i, text in enumerate(prompt_texts(workload, n)):
            prompt = eng.tokenize_chat([{"role": "user", "content": text}]) if chat else eng.tokenize(text)
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative=False)
            out.append((prompt, eng.generate([Request(str(i), tuple(prompt), params)])[str(i)].token_ids))
    return out


class PassTimes:
    """A device's pass times from ``passes``' JSON, in one-token passes: a pass of ``n`` tokens costs its steady time
    after a pass of the same size (llama.cpp replays its CUDA graph) and its alternating time after another size."""

    def __init__(self, measured: dict[str, dict[str, float]], changes_cost: bool = True) -> None:
        self.changes_cost = changes_cost  # False: every pass at its steady time, as if a size change cost nothing
        steady = {int(n): t for n, t in measured["steady_ms"].items()}
        alt = {int(n): t for n, t in measured["alternating_ms"].items()}
        one = steady[1]
        # the one-token pass after another size: its pair's partner (alternating time / ratio), median over sizes
        alt[1] = statistics.median(alt[n] / measured["alternating_ratio"][str(n)] for n in alt)
        self._steady = ([*sorted(steady)], [steady[n] / one for n in sorted(steady)])
        self._alt = ([*sorted(alt)], [alt[n] / one for n in sorted(alt)])

    def __call__(self, n: int, previous: int) -> float:
        sizes, times = self._steady if n == previous or not self.changes_cost else self._alt
        return float(np.interp(n, sizes, times))


def replay(answers: list[tuple[list[int], list[int]]], c: float, max_draft: int, times: PassTimes | None = None,
           pad: bool = False) -> dict[str, float]:
    """Prompt lookup (n 2..4, as the engine's defaults) with the engine's policy, drafts costing ``c`` each (with
    ``times``: each pass priced by the device's measured times instead). ``pad``: a step that drafts drafts
    ``max_draft`` tokens, a short lookup padded with its last token, so passes keep one size."""
    tokens = steps = drafted = kept = changes = 0
    cost = lookup_s = 0.0
    for prompt, answer in answers:
        seq, idx, track, i, size = list(prompt), NgramIndex(2, 4), Track(max_draft), 0, 1
        while i < len(answer):
            limit = min(max_draft, len(answer) - i - 1)
            n = track.worth(limit, c / (1 + c), 1)
            n = limit if pad and n else n
            t0 = time.perf_counter()
            draft = idx.draft(seq, n) if n else []
            lookup_s += time.perf_counter() - t0
            draft += [(draft or seq)[-1]] * (n - len(draft)) if pad else []
            a = 0
            while a < len(draft) and draft[a] == answer[i + a]:
                a += 1
            seq += answer[i:i + a + 1]
            changes += 1 + len(draft) != size
            cost += times(1 + len(draft), size) if times else 1 + c * len(draft)
            size = 1 + len(draft)
            i, steps, tokens, drafted, kept = i + a + 1, steps + 1, tokens + a + 1, drafted + len(draft), kept + a
            if draft:
                track.draft = draft
                track.settle(a)
    return {"cost": c, "tokens_per_pass": tokens / steps, "drafted": drafted, "kept": kept,
            "speedup": tokens / cost, "lookup_us": 1e6 * lookup_s / steps, "size_changes": changes / steps}


def price(model: str, answers_file: str, passes_file: str, max_draft: int) -> dict[str, object]:
    """A replay's recorded answers (their prompts tokenized again with ``model``) replayed with a device's measured
    pass times: the engine's rule, and the same with every drafting step padded to one size."""
    recorded = json.loads(Path(answers_file).read_text())
    measured = json.loads(Path(passes_file).read_text())
    with L.Model(EngineConfig(model_path=model, n_gpu_layers=0)) as m:
        prompts = [m.tokenize(text) for text in prompt_texts(recorded["workload"], len(recorded["answers"]))]
    answers = list(zip(prompts, recorded["answers"], strict=True))
    c = measured["drafted_token_cost_steady"]["9"]  # the cost the engine would measure for its usual passes
    times = PassTimes(measured)
    return {"answers": answers_file.rsplit("/", 1)[-1], "passes": passes_file.rsplit("/", 1)[-1], "cost": c,
            "max_draft": max_draft, "steady_only": replay(answers, c, max_draft, PassTimes(measured, False)),
            "engine_rule": replay(answers, c, max_draft, times),
            "padded_to_one_size": replay(answers, c, max_draft, times, pad=True)}


def oracle(answers: list[tuple[list[int], list[int]]], tail: int, limit: int) -> float:
    """Tokens per pass if each step drafted exactly the longest run any earlier occurrence of the last ``tail``
    tokens continues correctly (at most ``limit``): a bound for lookup whatever occurrence it picks."""
    tokens = steps = 0
    for prompt, answer in answers:
        seq, i = list(prompt), 0
        while i < len(answer):
            best, want = 0, answer[i:i + limit]
            for j in range(tail, len(seq)):
                if seq[j - tail:j] == seq[len(seq) - tail:]:
                    a = 0
                    while a < len(want) - 1 and j + a < len(seq) and seq[j + a] == want[a]:
                        a += 1
                    best = max(best, a)
            seq += answer[i:i + best + 1]
            i, steps, tokens = i + best + 1, steps + 1, tokens + best + 1
    return tokens / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("passes", "replay", "price"))
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--answers", help="price: a replay's JSON, whose recorded answers are replayed")
    ap.add_argument("--passes", help="price: a device's passes JSON, whose pass times price each pass")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ngl", type=int, default=-1, help="GPU layers (default: all)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--workload", choices=[w for w in WORKLOADS if w != "random"], default="edit")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--costs", default="0.02,0.05,0.2,0.55")
    ap.add_argument("--chat", action="store_true", help="replay: send each prompt in the model's chat template")
    args = ap.parse_args()
    model = args.model or str(default_model_path())
    if args.what == "passes":
        result = passes(model, args.threads, args.ngl, args.reps)
    elif args.what == "price":
        result = price(model, args.answers, args.passes, args.max_draft)
    else:
        answers = record(model, args.workload, args.requests, args.max_tokens, args.threads, args.chat)
        result = {"model": model.rsplit("/", 1)[-1], "workload": args.workload, "chat": args.chat,
                  "requests": args.requests,
                  "max_tokens": args.max_tokens, "max_draft": args.max_draft,
                  "replay": [replay(answers, float(c), args.max_draft) for c in args.costs.split(",")],
                  "oracle_tokens_per_pass": {f"tail {n}": oracle(answers, n, args.max_draft) for n in (1, 2, 3)},
                  "answers": [a for _, a in answers]}
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
