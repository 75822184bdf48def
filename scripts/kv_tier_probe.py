"""What the KV tiers cost against what they save, in-process: a prompt's first token computed from scratch, and
the same prompt's first token after its slot went to another prompt, its KV restored from the park, RAM or disk tier
(engine/kv_park.py, engine/kv_tiers.py).

    python scripts/kv_tier_probe.py [MODEL.gguf] [--tokens 900] [--ctx 2048] [--threads N] [--reps 3] [--json OUT]

One slot, so every other prompt evicts the one before: the engine parks or saves its state first. Lines: the
first token with the prompt prefilled whole; restored from the park (the other prompt parked and this one moved back:
two stream copies of ``--ctx`` tokens each, inside the next pass, plus the last token's decode); restored from RAM;
restored from disk (the RAM tier off, the state read back from its file and checked); and the save, restore and
prefill times alone (the engine's own counters: seconds in ``llama_state_seq_get/set_data_ext``, and the prefill's
decode time). Best of ``--reps`` (the machine may be shared). The numbers are in docs/BENCHMARKS.md ("Sessions that
outnumber the slots").
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

# isort: off
import llamafleet.engine.llama  # noqa: F401  (llama.cpp before numpy, or a CUDA build can crash: engine/llama.py)
# isort: on

from llamafleet.bench.prompts import synthetic_text
from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

FIRST = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def first_token(eng: Engine, rid: str, prompt: tuple[int, ...]) -> tuple[float, int]:
    """Seconds to the first token of ``prompt``, and how many of its tokens came from a cache."""
    t0 = time.perf_counter()
    g = eng.generate([Request(rid, prompt, FIRST)])[rid]
    return time.perf_counter() - t0, g.cached_tokens


def probe(cfg: EngineConfig, n: int, reps: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with Engine(cfg) as eng:
        for r in range(reps):
            p = tuple(eng.tokenize(synthetic_text(n, f"probe/{r}"))[:n])
            other = tuple(eng.tokenize(synthetic_text(64, f"other/{r}")))
            d0 = eng.stats().decode_seconds_total
            cold, _ = first_token(eng, f"cold{r}", p)
            prefill = eng.stats().decode_seconds_total - d0
            held = eng.tiers.ram_bytes
            first_token(eng, f"evict{r}", other)  # takes the slot: p's state goes to the tier
            t = eng.stats().tiers
            assert t is not None
            out["state_mib"] = max(out.get("state_mib", 0.0), (t.ram_bytes - held) / 2**20)
            restored_s0 = sum(t.restore_seconds.values())
            warm, cached = first_token(eng, f"warm{r}", p)
            t2 = eng.stats().tiers
            assert t2 is not None and cached >= n - 1, f"not restored ({cached} of {n} tokens cached)"
            for key, v in (("cold", cold), ("warm", warm), ("prefill", prefill),
                           ("restore", sum(t2.restore_seconds.values()) - restored_s0)):
                out[key] = min(out.get(key, v), v)
        t3 = eng.stats().tiers
        assert t3 is not None
        out["save"] = t3.save_seconds / max(1, t3.saves)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF file (default: the demo model)")
    ap.add_argument("--tokens", type=int, default=900, help="tokens of the prompt")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=2048, help="tokens per slot (a parked stream's copy is all of them)")
    ap.add_argument("--json", help="write the numbers to this file too")
    args = ap.parse_args()
    base = EngineConfig(model_path=args.model or str(default_model_path()), n_seq=1, n_ctx_per_seq=args.ctx,
                        n_batch=512, n_threads=args.threads)
    park = probe(EngineConfig(**{**base.__dict__, "n_park": 1}), args.tokens, args.reps)
    ram = probe(EngineConfig(**{**base.__dict__, "cache_ram_bytes": 1 << 30}), args.tokens, args.reps)
    with tempfile.TemporaryDirectory() as d:
        disk = probe(EngineConfig(**{**base.__dict__, "cache_ram_bytes": 0, "cache_dir": d,
                                     "cache_disk_bytes": 1 << 30}), args.tokens, args.reps)
    print(f"prompt of {args.tokens} tokens, one slot of {args.ctx}, best of {args.reps}; a state is "
          f"{ram['state_mib']:.1f} MiB")
    print(f"  first token, prefilled whole       {ram['cold'] * 1e3:9.1f} ms "
          f"(prefill decode {ram['prefill'] * 1e3:.1f} ms)")
    print(f"  first token, restored from park    {park['warm'] * 1e3:9.1f} ms ({park['warm'] / park['prefill']:.2%} of "
          "the prefill: two stream copies and the last token's decode)")
    print(f"  first token, restored from RAM     {ram['warm'] * 1e3:9.1f} ms (restore {ram['restore'] * 1e3:.2f} ms: "
          f"{ram['restore'] / ram['prefill']:.2%} of the prefill)")
    print(f"  first token, restored from disk    {disk['warm'] * 1e3:9.1f} ms (read, check and restore "
          f"{disk['restore'] * 1e3:.2f} ms: {disk['restore'] / disk['prefill']:.2%} of the prefill)")
    print(f"  saving a state before its slot is reused: {ram['save'] * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"tokens": args.tokens, "ctx": args.ctx, "reps": args.reps, "park": park, "ram": ram,
                       "disk": disk}, f, indent=1)


if __name__ == "__main__":
    main()
