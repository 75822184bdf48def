"""llama-server's ``/infill`` through a real ``llamafleet serve``: a tiny synthetic model whose vocabulary names FIM
tokens answers in llama-server's ``/completion`` shape, whole and streamed (equal at temperature 0), its prompt laid
out token for token as the FIM layout says (counted against ``/tokenize``), cut to fit the context; the next
keystroke's request goes to the replica that holds the code before the cursor and reuses it; ``response_fields`` picks
fields; the demo model, which has no FIM tokens, and llama.cpp's own bad ``input_extra``
cases are 400s."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from conftest import FleetServer
from llamafleet.engine.infill import SNIPPET
from llamafleet.model.synth import SHAPES, find_vocab, write_model

FIM = (3, 4, 5)  # the LLaMA-2 vocabulary has no FIM tokens: three of its byte tokens are named as such
PREFIX = '#include <cstdio>\n#include "llama.h"\n\nint main() {\n'
PROMPT = "    int n_threads = llama_"
SUFFIX = "}\n"


@pytest.fixture(scope="module")
def coder(launch_fleet: Callable[[list[str]], FleetServer], tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    path = write_model(tmp_path_factory.mktemp("fim") / "tiny-fim.gguf", SHAPES["tiny"], "q8_0", find_vocab(),
                       progress=False, fim=FIM)
    server = launch_fleet(["--model", str(path), "--replicas", "2", "--parallel", "2", "--ctx", "256",
                           "--threads", "1"])
    server.wait_ready()
    return server


def infill(server: FleetServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                     "prompt": PROMPT, **body}, timeout=120)


def n_tokens(server: FleetServer, text: str) -> int:
    r = httpx.post(f"{server.url}/tokenize", json={"content": text, "parse_special": False}, timeout=60)
    return len(r.json()["tokens"])


def test_infill_answers_in_llama_servers_shape(coder: FleetServer) -> None:
    r = infill(coder, n_predict=8, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stop"] is True and isinstance(body["content"], str) and body["tokens_predicted"] <= 8
    assert body["stop_type"] in ("limit", "eos") and set(body["timings"]) >= {"prompt_n", "predicted_per_second"}
    # BOS, FIM_PRE prefix prompt, FIM_SUF suffix, FIM_MID
    expected = 1 + 3 + n_tokens(coder, PREFIX) + n_tokens(coder, PROMPT) + n_tokens(coder, SUFFIX)
    assert body["tokens_evaluated"] == expected
    extra = [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}]
    with_extra = infill(coder, n_predict=4, input_extra=extra).json()
    assert with_extra["tokens_evaluated"] == expected + n_tokens(coder, SNIPPET) + n_tokens(coder, extra[0]["text"])


def test_a_stream_is_the_whole_answer_in_pieces(coder: FleetServer) -> None:
    whole = infill(coder, n_predict=12, temperature=0).json()
    with httpx.stream("POST", f"{coder.url}/infill", timeout=120, json={
            "input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": PROMPT, "n_predict": 12, "temperature": 0,
            "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all(line.startswith("data: {") for line in lines)  # no [DONE]: llama-server ends these streams bare
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert chunks[-1]["tokens_predicted"] == whole["tokens_predicted"]


def test_the_next_keystroke_reuses_the_code_before_the_cursor(coder: FleetServer) -> None:
    prefix = "".join(f"    total += values[{i}] * weights[{i}];\n" for i in range(12))  # ~450 characters
    first = infill(coder, input_prefix=prefix, prompt="    return tot", n_predict=2)
    second = infill(coder, input_prefix=prefix, prompt="    return total", n_predict=2)
    assert first.headers["x-llamafleet-replicas"] == second.headers["x-llamafleet-replicas"]
    assert second.json()["tokens_cached"] >= n_tokens(coder, prefix), second.json()


def test_response_fields_pick_nested_fields(coder: FleetServer) -> None:
    body = infill(coder, n_predict=2, response_fields=["content", "timings/prompt_n", "nope"]).json()
    assert set(body) == {"content", "timings/prompt_n"} and isinstance(body["timings/prompt_n"], int)


def test_a_long_prefix_is_cut_to_fit_the_context(coder: FleetServer) -> None:
    long = "".join(f"int v{i} = {i};\n" for i in range(400))  # thousands of tokens, against a 256-token context
    r = infill(coder, input_prefix=long, n_predict=16)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_evaluated"] <= 256 - 16


@pytest.mark.parametrize("extra", [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
                                   {"filename": 123, "text": 456}])
def test_invalid_input_extra_is_refused(coder: FleetServer, extra: dict[str, Any]) -> None:
    r = infill(coder, input_extra=[extra])
    assert r.status_code == 400 and "input_extra[0]" in r.json()["error"]["param"], r.text


def test_a_model_without_fim_tokens_is_a_400(fleet: FleetServer) -> None:
    r = infill(fleet, n_predict=4)
    assert r.status_code == 400, r.text
    assert "cannot fill in the middle" in r.json()["error"]["message"] and "FIM_PRE" in r.json()["error"]["message"]
