"""The model families the server recognises, each with a real chat template and tokenizer from llama.cpp's source,
raw model outputs and what must be read from them, and the conformance matrix of docs/MODELS.md.

Outputs marked ``test-chat.cpp`` are the raw outputs of llama.cpp's own chat tests (tests/test-chat.cpp) for the
same template, with the message expected from them; the others are written here in the family's format. The unit
tests (tests/unit/api/test_families.py) read every case whole and streamed in every split; the server tests
(tests/integration/test_families_server.py) force the output of each cell of the matrix (and each malformed call)
with the request's ``grammar`` on a synthetic model carrying the family's template and tokenizer, and check what the
OpenAI and Anthropic SDKs receive.
``python tests/family_matrix.py`` writes docs/MODELS.md from :data:`FAMILIES` (a unit test checks it is current).
"""

from __future__ import annotations

from family_cases_more import MORE
from family_types import CALL, CALL2, HELLO, NO_THINK, OPENED, THINKING, Case, Family


def _json_block(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def _xml(name: str, **args: int) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _glm(name: str, **args: int) -> str:
    return f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                                             for k, v in args.items()) + "</tool_call>"


_DS = "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>"
_KIMI = "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>"


def _kimi(name: str, i: int, args: str) -> str:
    return f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


FAMILIES: tuple[Family, ...] = (
    Family("qwen3", "Qwen3, QwQ", "Qwen-Qwen3-0.6B", "qwen2", cases=(
        Case("chat", HELLO, HELLO),
        Case("reasoning", f"<think>\n{THINKING}\n</think>\n\n{HELLO}", HELLO, THINKING),
        Case("tools", f"<think>\n{THINKING}\n</think>\n\n" + _json_block("special_function", '{"arg1": 1}'),
             reasoning=THINKING, calls=(CALL,)),
        Case("parallel", _json_block("special_function", '{"arg1": 1}') + "\n"
             + _json_block("special_function_with_opt", '{"arg1": 1, "arg2": 2}'), calls=(CALL, CALL2)),
        Case("text before a call", "Let me check." + _json_block("special_function", '{"arg1": 1}'),
             "Let me check.", calls=(CALL,)),
        Case("call inside reasoning", "<think>\nI should call it.\n" + _json_block("special_function", '{"arg1": 1}'),
             reasoning="I should call it.", calls=(CALL,)),
        Case("malformed call", '<tool_call>\n{"name": "special_function", "arguments": {"arg1": }\n</tool_call>',
             '<tool_call>\n{"name": "special_function", "arguments": {"arg1": }\n</tool_call>',
             streamed=(("special_function", '{"arg1": }'),)),
    )),
    Family("hermes", "Qwen 2.5, Hermes 2/3, Granite 4", "Qwen-Qwen2.5-7B-Instruct", "llama-spm", cases=(
        Case("chat", HELLO, HELLO),
        Case("tools", "<tool_call>\n" '{"name": "special_function", "arguments": {"arg1": 1}}' "</tool_call>",
             calls=(CALL,), source="test-chat.cpp"),
        Case("text before a call", HELLO + "<tool_call>\n" '{"name": "special_function", "arguments": {"arg1": 1}}'
             "</tool_call>", HELLO, calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", _json_block("special_function", '{"arg1": 1}') + "\n"
             + _json_block("special_function_with_opt", '{"arg1": 1, "arg2": 2}'), calls=(CALL, CALL2)),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("qwen3.5", "Qwen 3.5, Nemotron 3 Nano, Step 3.5", "Qwen3.5-4B", "qwen35", opens_think=True, cases=(
        Case("reasoning", f"{THINKING}\n</think>\n\n{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", f"{THINKING}\n</think>\n\n" + _xml("special_function", arg1=1), reasoning=THINKING,
             calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", "</think>\n\n" + _xml("special_function", arg1=1) + "\n"
             + _xml("special_function_with_opt", arg1=1, arg2=2), calls=(CALL, CALL2), source="test-chat.cpp"),
    ), not_supported={"chat": OPENED}),
    Family("qwen3-coder", "Qwen3-Coder", "Qwen3-Coder", "llama-spm", cases=(
        Case("chat", HELLO, HELLO),
        Case("tools", _xml("special_function", arg1=1), calls=(CALL,)),
        Case("parallel", _xml("special_function", arg1=1) + "\n" + _xml("special_function_with_opt", arg1=1, arg2=2),
             calls=(CALL, CALL2)),
        Case("malformed call", "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n",
             "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n"),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("llama3", "Llama 3.1, 3.2, 3.3", "meta-llama-Llama-3.1-8B-Instruct", "llama-bpe", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", '{"name": "special_function", "parameters": {"arg1": 1}}', calls=(CALL,)),
        Case("parallel", '<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}}; '
             '{"name": "special_function_with_opt", "parameters": {"arg1": 1, "arg2": 2}}', calls=(CALL, CALL2)),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("mistral", "Mistral Nemo", "mistralai-Mistral-Nemo-Instruct-2407", "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
             calls=(CALL,), ids=("123456789",), source="test-chat.cpp"),
        Case("parallel", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "000000001"}, '
             '{"name": "special_function_with_opt", "arguments": {"arg1": 1, "arg2": 2}, "id": "000000002"}]',
             calls=(CALL, CALL2), ids=("000000001", "000000002")),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("mistral-args", "Mistral Small 3.2, Devstral", "Mistral-Small-3.2-24B-Instruct-2506", "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}', calls=(CALL,),
             ids=("123456789",), source="test-chat.cpp"),
        Case("parallel", '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
             '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
             calls=(CALL, CALL2), ids=("000000001", "000000002"), source="test-chat.cpp"),
        Case("text before a call", HELLO + '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', HELLO, calls=(CALL,),
             source="test-chat.cpp"),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("magistral", "Magistral, Ministral 3 Reasoning", "mistralai-Ministral-3-14B-Reasoning-2512", "llama-spm",
           cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("reasoning", f"[THINK]{THINKING}[/THINK]{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", f'[THINK]{THINKING}[/THINK][TOOL_CALLS]special_function[ARGS]{{"arg1":1}}', reasoning=THINKING,
             calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'
             '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}', calls=(CALL, CALL2),
             source="test-chat.cpp"),
    )),
    Family("deepseek-r1", "DeepSeek R1 (and its distills)", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "llama-spm",
           opens_think=True, cases=(
        Case("reasoning", f"{THINKING}</think>{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", "</think>" + _DS.format("<｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
                                              "```json\n{\"arg1\": 1}```<｜tool▁call▁end｜>"), calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", "</think>" + _DS.format(
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n```"
            "<｜tool▁call▁end｜>"
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function_with_opt\n```json\n"
            "{\"arg1\": 1, \"arg2\": 2}\n```<｜tool▁call▁end｜>"), calls=(CALL, CALL2)),
    ), not_supported={"chat": OPENED}),
    Family("deepseek-v3", "DeepSeek V3.1", "deepseek-ai-DeepSeek-V3.1", "llama-spm", cases=(
        Case("chat", HELLO, HELLO),
        Case("tools", _DS.format("<｜tool▁call▁begin｜>special_function<｜tool▁sep｜>{\"arg1\": 1}<｜tool▁call▁end｜>"),
             calls=(CALL,), source="test-chat.cpp"),
        Case("reasoning", f"<think>{THINKING}</think>{HELLO}", HELLO, THINKING),
        Case("parallel", _DS.format(
            "<｜tool▁call▁begin｜>special_function<｜tool▁sep｜>{\"arg1\": 1}<｜tool▁call▁end｜>"
            "<｜tool▁call▁begin｜>special_function_with_opt<｜tool▁sep｜>{\"arg1\": 1, \"arg2\": 2}"
            "<｜tool▁call▁end｜>"),
            calls=(CALL, CALL2)),
    )),
    Family("glm", "GLM 4.5, 4.6, 4.7", "GLM-4.6", "llama-spm", cases=(
        Case("chat", HELLO, HELLO),
        Case("tools", "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
             calls=(CALL,), source="test-chat.cpp"),
        Case("reasoning", f"<think>{THINKING}</think>{HELLO}", HELLO, THINKING),
        Case("parallel", _glm("special_function", arg1=1) + "\n" + _glm("special_function_with_opt", arg1=1, arg2=2),
             calls=(CALL, CALL2)),
    )),
    Family("kimi-thinking", "Kimi K2 (Thinking)", "Kimi-K2-Thinking", "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", "<think>I'm thinking about this</think>" + _KIMI.format(_kimi("special_function", 0,
                                                                                   '{"arg1": 1}')),
             reasoning="I'm thinking about this", calls=(CALL,), ids=("functions.special_function:0",),
             source="test-chat.cpp"),
        Case("parallel", _KIMI.format(_kimi("special_function", 0, '{"arg1": 1}')
                                      + _kimi("special_function_with_opt", 1, '{"arg1": 1, "arg2": 2}')),
             calls=(CALL, CALL2), ids=("functions.special_function:0", "functions.special_function_with_opt:1")),
        Case("reasoning", f"<think>{THINKING}</think>{HELLO}", HELLO, THINKING),
    )),
    Family("granite", "Granite 3.3", "ibm-granite-granite-3.3-2B-Instruct", "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("reasoning", f"<think>{THINKING}</think>{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", '<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}]', calls=(CALL,)),
        Case("parallel", '<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}, '
             '{"name": "special_function_with_opt", "arguments": {"arg1": 1, "arg2": 2}}]', calls=(CALL, CALL2)),
    )),
)
_OSS_CALL = "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{}<|call|>"
FAMILIES += (
    Family("gpt-oss", "gpt-oss", "openai-gpt-oss-120b", "llama-spm", cases=(
        Case("chat", f"<|channel|>final<|message|>{HELLO}", HELLO, source="test-chat.cpp"),
        Case("reasoning", f"<|channel|>analysis<|message|>{THINKING}<|end|><|start|>assistant<|channel|>final"
             f"<|message|>{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", f"<|channel|>analysis<|message|>{THINKING}<|end|><|start|>assistant to=functions."
             'special_function<|channel|>analysis<|message|>{"arg1": 1}', reasoning=THINKING, calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", _OSS_CALL.format("special_function", '{"arg1": 1}') + "<|start|>assistant"
             + _OSS_CALL.format("special_function_with_opt", '{"arg1": 1, "arg2": 2}'), calls=(CALL, CALL2)),
        Case("recipient in the role header", ' to=functions.special_function<|channel|>analysis <|constrain|>json'
             '<|message|>{"arg1": 1}', calls=(CALL,), source="test-chat.cpp"),
        Case("content in the commentary channel", f"<|channel|>commentary<|message|>{HELLO}", HELLO,
             source="test-chat.cpp"),
    )),
)
_GEMMA = "<|tool_call>call:{}{}<tool_call|>"
_R7B = '<|START_ACTION|>[\n    {}\n]<|END_ACTION|>'
_R7B_CALL = '{{"tool_call_id": "{}", "tool_name": "{}", "parameters": {}}}'
_MINIMAX = "<minimax:tool_call>\n{}</minimax:tool_call>"
_DSML = "<｜DSML｜{0}>\n{{}}</｜DSML｜{0}>"


def _invoke(name: str, tag: str = "", **args: int) -> str:
    """A MiniMax M2 (or, with ``tag`` ｜DSML｜, DeepSeek V3.2) call."""
    string = ' string="false"' if tag else ""
    params = "".join(f'<{tag}parameter name="{k}"{string}>{v}</{tag}parameter>\n' for k, v in args.items())
    return f'<{tag}invoke name="{name}">\n{params}</{tag}invoke>\n'


def _seed(name: str, **args: int) -> str:
    params = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in args.items())
    return f"<seed:tool_call>\n<function={name}>\n{params}</function>\n</seed:tool_call>"


def _k3(name: str, index: int, **args: int) -> str:
    params = "".join(f'<|open|>argument key="{k}" type="number"<|sep|>{v}<|close|>argument<|sep|>'
                     for k, v in args.items())
    return f'<|open|>call tool="{name}" index="{index}"<|sep|>{params}<|close|>call<|sep|>'


_K3_END = "<|close|>tools<|sep|><|close|>message<|sep|>"
_K3_EMPTY = "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
FAMILIES += (
    Family("gemma4", "Gemma 4", "google-gemma-4-31B-it", "gemma-4", cases=(
        Case("chat", HELLO, HELLO),
        Case("reasoning", f"<|channel>thought\n{THINKING}<channel|>{HELLO}", HELLO, THINKING,
             source="test-chat.cpp"),
        Case("tools", _GEMMA.format("special_function", "{arg1:1}"), calls=(CALL,)),
        Case("parallel", _GEMMA.format("special_function", "{arg1:1}")
             + _GEMMA.format("special_function_with_opt", "{arg1:1,arg2:2}"), calls=(CALL, CALL2)),
        Case("text before a call", HELLO + _GEMMA.format("special_function", "{arg1:1}"), HELLO, calls=(CALL,)),
        Case("call after reasoning", f"<|channel>thought\n{THINKING}<channel|>"
             + _GEMMA.format("special_function", "{arg1:1}"), reasoning=THINKING, calls=(CALL,)),
        Case("string arguments", '<|tool_call>call:special_function{arg1:<|"|>a, b: {c}<|"|>}<tool_call|>',
             calls=(("special_function", {"arg1": "a, b: {c}"}),)),
    )),
    Family("command-r7b", "Command R7B", "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "llama-spm", cases=(
        Case("chat", f"<|START_RESPONSE|>{HELLO}<|END_RESPONSE|>", HELLO, source="test-chat.cpp"),
        Case("reasoning", f"<|START_THINKING|>{THINKING}<|END_THINKING|><|START_RESPONSE|>{HELLO}<|END_RESPONSE|>",
             HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", f"<|START_THINKING|>{THINKING}<|END_THINKING|>"
             + _R7B.format(_R7B_CALL.format(0, "special_function", '{"arg1": 1}')), reasoning=THINKING,
             calls=(CALL,), ids=("0",), source="test-chat.cpp"),
        Case("parallel", _R7B.format(_R7B_CALL.format(0, "special_function", '{"arg1": 1}') + ",\n    "
                                     + _R7B_CALL.format(1, "special_function_with_opt", '{"arg1": 1, "arg2": 2}')),
             calls=(CALL, CALL2), ids=("0", "1")),
    )),
    Family("minimax-m2", "MiniMax M2", "MiniMax-M2", "llama-spm", opens_think=True, cases=(
        Case("reasoning", f"{THINKING}\n</think>\n\n{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", "\n</think>\n\n" + _MINIMAX.format(_invoke("special_function", arg1=1)), calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", "</think>" + _MINIMAX.format(_invoke("special_function", arg1=1)
                                                      + _invoke("special_function_with_opt", arg1=1, arg2=2)),
             calls=(CALL, CALL2)),
        Case("call after reasoning", "Let's call a tool:\n</think>\n\n"
             + _MINIMAX.format(_invoke("special_function", arg1=1)), reasoning="Let's call a tool:", calls=(CALL,)),
    ), not_supported={"chat": OPENED}),
    Family("seed-oss", "Seed-OSS", "ByteDance-Seed-OSS", "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("reasoning", "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!", "Hello, world!",
             "I'm thinking about the answer", source="test-chat.cpp"),
        Case("tools", _seed("special_function", arg1=1), calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", _seed("special_function", arg1=1) + "\n" + _seed("special_function_with_opt", arg1=1, arg2=2),
             calls=(CALL, CALL2), source="test-chat.cpp"),
    )),
    Family("kimi-k3", "Kimi K3", "Kimi-K3", "llama-spm", opens_think=True, cases=(
        Case("reasoning", f"I'm thinking about this<|close|>think<|sep|><|open|>response<|sep|>{HELLO}"
             "<|close|>response<|sep|><|close|>message<|sep|>", HELLO, "I'm thinking about this",
             source="test-chat.cpp"),
        Case("tools", "I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
             "<|open|>tools<|sep|>" + _k3("special_function", 1, arg1=1) + _K3_END, "On it.", "I should call it",
             calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", _K3_EMPTY + _k3("special_function", 1, arg1=1)
             + _k3("special_function_with_opt", 2, arg1=1, arg2=2) + _K3_END, calls=(CALL, CALL2)),
    ), not_supported={"chat": OPENED}),
    *(Family(name, label, template, "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("reasoning", f"<think>{THINKING}</think>{HELLO}", HELLO, THINKING),
        Case("tools", section.format(_invoke("special_function", "｜DSML｜", arg1=1)), calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", section.format(_invoke("special_function", "｜DSML｜", arg1=1)
                                        + _invoke("special_function_with_opt", "｜DSML｜", arg1=1, arg2=2)),
             calls=(CALL, CALL2)),
        Case("text before a call", "Let me call the function.\n\n"
             + section.format(_invoke("special_function", "｜DSML｜", arg1=1)), "Let me call the function.",
             calls=(CALL,)),
    )) for name, label, template, section in (  # their DSML calls in a function_calls (V3.2), tool_calls (V4) section
        ("deepseek-v3.2", "DeepSeek V3.2", "deepseek-ai-DeepSeek-V3.2", _DSML.format("function_calls")),
        ("deepseek-v4", "DeepSeek V4", "deepseek-ai-DeepSeek-V4", _DSML.format("tool_calls")))),
)
_FIRE = 'functools[{}]'
_FIRE_CALL = '{{"name": "{}", "arguments": {}}}'
FAMILIES += (
    Family("functionary", "Functionary v3.1", "meetkai-functionary-medium-v3.1", "llama-bpe", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", '<function=special_function>{"arg1": 1}</function>', calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", '<function=special_function>{"arg1": 1}</function>'
             '<function=special_function_with_opt>{"arg1": 1, "arg2": 2}</function>', calls=(CALL, CALL2)),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("firefunction", "FireFunction v2", "fireworks-ai-llama-3-firefunction-v2", "llama-bpe", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", " " + _FIRE.format(_FIRE_CALL.format("special_function", '{"arg1": 1}')), calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", " " + _FIRE.format(_FIRE_CALL.format("special_function", '{"arg1": 1}') + ", "
                                            + _FIRE_CALL.format("special_function_with_opt", '{"arg1": 1, "arg2": 2}')),
             calls=(CALL, CALL2)),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
)
_LFM = "<|tool_call_start|>[{}]<|tool_call_end|>"
_LFM_CASES = (  # (llama.cpp's tests read all LFM2 templates alike)
    Case("chat", HELLO, HELLO, source="test-chat.cpp"),
    Case("tools", _LFM.format("special_function(arg1=1)"), calls=(CALL,), source="test-chat.cpp"),
    Case("parallel", _LFM.format("special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)"),
         calls=(CALL, CALL2), source="test-chat.cpp"),
    Case("reasoning", f"<think>{THINKING}</think>{HELLO}", HELLO, THINKING),
)
FAMILIES += (
    Family("lfm2-think", "LFM2.5 (thinking), LFM2", "LFM2.5-8B-A1B", "llama-spm", cases=(
        *_LFM_CASES,
        Case("text before a call", "Let me check." + _LFM.format("special_function(arg1=1)"), "Let me check.",
             calls=(CALL,)),
        Case("Python and JSON literals", _LFM.format('special_function(arg1="a\\nb", arg2=[True, null])'),
             calls=(("special_function", {"arg1": "a\nb", "arg2": [True, None]}),)),
    )),
)
FAMILIES += (Family("lfm2.5", "LFM2.5 Instruct", "LFM2.5-Instruct", "llama-spm", cases=_LFM_CASES), *MORE)
