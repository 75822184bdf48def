"""TTFT of a later turn, alone and in pairs, against a server at URL (stream /v1/completions)."""
import json, sys, time, threading
import httpx
from llamafleet.bench.prompts import synthetic_text

URL = sys.argv[1]; LABEL = sys.argv[2]; SEED = sys.argv[3] if len(sys.argv) > 3 else "p"
N = 4
MODEL = sys.argv[4] if len(sys.argv) > 4 else "SmolLM2-135M-Instruct.Q4_1"
def one(prompt):
    t0 = time.perf_counter(); ttft = None; text = ""; usage = None
    with httpx.stream("POST", URL + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 32, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
            timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            d = json.loads(line[6:])
            if d.get("choices") and d["choices"][0].get("text"):
                if ttft is None: ttft = time.perf_counter() - t0
                text += d["choices"][0]["text"]
            if d.get("usage"): usage = d["usage"]
            if d.get("timings"): usage = {**(usage or {}), "timings": d["timings"]}
    return ttft, time.perf_counter() - t0, text, usage

hist = {i: "System: " + synthetic_text(870, f"{SEED}/priv/{i}") for i in range(N)}
def turn(i, t):
    p = hist[i] + "\nUser: " + synthetic_text(25, f"{SEED}/u/{i}/{t}") + "\nAssistant:"
    ttft, e2e, text, usage = one(p)
    hist[i] = p + text
    return ttft, e2e, usage
res = {"label": LABEL, "alone": [], "pair": []}
for i in range(N): turn(i, 1)          # turn 1, one at a time: every slot has been reused since session 0
for i in range(2): res["alone"].append(turn(i, 2))   # turn 2 alone
out = [None, None]
def w(k, i): out[k] = turn(i, 2)
ts = [threading.Thread(target=w, args=(k, 2 + k)) for k in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
res["pair"] = out
for i in range(2): res["alone"].append(turn(i, 3))
print(json.dumps(res))
