"""What reading an answer's reasoning and tool calls costs per token, beside what the token itself costs.

    python scripts/parse_probe.py [MODEL.gguf] [--tokens 256] [--threads N] [--json OUT]   (default: the demo model)

One greedy answer is generated in-process, one step after another (one sequence: the slowest per-token case for the
engine, so the largest share for parsing is the *smallest* engine time; a server adds its HTTP costs on top); the
time per token is the step's wall time. Its text pieces, exactly as they came, are then fed to the API's answer
splitter (``llamafleet.api.answer``) of a thinking family with tools (Qwen3's: think markers and ``<tool_call>``
held back) as a stream reads them (calls read as they are written), many times over; the same with the text wrapped
in a think block and a call at the end, with text full of ``<`` (every one a possible marker, held and re-scanned),
and with the whole answer as a call's argument, streamed (Qwen3's JSON, and Qwen3-Coder's XML parameter, complete
only at its closing tag). The ratio is the splitter's time per token over the engine's. The numbers are in
docs/BENCHMARKS.md ("Reading reasoning and tool calls").
"""

from __future__ import annotations

import argparse
import json
import os
import time

# isort: off
import llamafleet.engine.llama as L  # noqa: F401  llama.cpp before numpy (see engine/llama.py)
# isort: on

from llamafleet.api.answer import AnswerSplitter
from llamafleet.engine.engine import Engine
from llamafleet.engine.families import FAMILIES
from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def answer_pieces(path: str, tokens: int, threads: int) -> tuple[list[str], float]:
    """The text pieces of one greedy answer and the mean wall time of the steps that produced them (s/token)."""
    cfg = EngineConfig(model_path=path, n_seq=1, n_ctx_per_seq=tokens + 128, n_threads=threads)
    with Engine(cfg) as engine:
        prompt = engine.tokenize_chat([{"role": "user", "content": "Tell me a long story about a lighthouse."}])
        engine.add_request(Request("r", tuple(prompt), SamplingParams(max_tokens=tokens, temperature=0.0,
                                                                      ignore_eos=True)))
        pieces, times = [], []
        while engine.has_work():
            t0 = time.perf_counter()
            outs = engine.step()
            dt = time.perf_counter() - t0
            for out in outs:
                if out.token_ids:  # a step that produced a token (the first ones only prefill)
                    pieces.append(out.text)
                    times.append(dt)
    decode = times[1:]  # the first token's step holds the prompt's prefill
    return pieces, sum(decode) / len(decode)


def split_cost(pieces: list[str], repeat: int, family: str = "qwen3") -> float:
    """Seconds per piece for the answer splitter of ``family`` with tools to read ``pieces`` as a stream."""
    t0 = time.perf_counter()
    for _ in range(repeat):
        splitter = AnswerSplitter(FAMILIES[family], TOOLS, stream=True)
        for piece in pieces:
            splitter.feed(piece)
        splitter.finish()
    return (time.perf_counter() - t0) / (repeat * len(pieces))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", default=None, help="write the numbers here too")
    args = ap.parse_args()
    path = args.model or str(default_model_path(progress=False))
    pieces, step_s = answer_pieces(path, args.tokens, args.threads)
    variants = {
        "plain answer": pieces,
        "think block, then a call": ["<think>\n", *pieces, "\n</think>\n\n", *(CALL[i:i + 4] for i in
                                                                              range(0, len(CALL), 4))],
        "every piece a '<'": [p + "<" for p in pieces],
        "the answer as a call's JSON argument": ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "',
                                                 *(json.dumps(p)[1:-1] for p in pieces), '"}}\n</tool_call>'],
    }
    coder = ["<tool_call>\n<function=get_weather>\n<parameter=city>\n", *pieces, "\n</parameter>\n</function>\n"
             "</tool_call>"]
    result = {"model": os.path.basename(path), "tokens": len(pieces), "threads": args.threads,
              "engine_ms_per_token": round(step_s * 1e3, 3), "load": os.getloadavg()[0], "splitter": {}}
    for name, (family, variant) in {**{k: ("qwen3", v) for k, v in variants.items()},
                                    "the answer as a Qwen3-Coder XML parameter": ("qwen3-coder", coder)}.items():
        per = split_cost(variant, args.repeat, family)
        result["splitter"][name] = {"us_per_token": round(per * 1e6, 2),
                                    "share_of_token_time_pct": round(100 * per / step_s, 3)}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
