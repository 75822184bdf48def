"""The families of tests/family_cases.py read since Functionary v3.2 (the table goes on here), each with its real
template and tokenizer from llama.cpp's source and raw outputs (llama.cpp's own test outputs where it has them)."""

from __future__ import annotations

from family_types import CALL, CALL2, HELLO, NO_THINK, OPENED, THINKING, Case, Family

_V32 = 'special_function\n{"arg1": 1}'  # after the ">>>" that the template's prompt ends with
_M3 = "]<]minimax[>["
_M3_CALLS = f"{_M3}<tool_call>\n{{}}{_M3}</tool_call>"


def _m3(name: str, **args: int) -> str:
    """A MiniMax M3 call: each parameter an element named by its key."""
    return (f'{_M3}<invoke name="{name}">' + "".join(f"{_M3}<{k}>{v}{_M3}</{k}>" for k, v in args.items())
            + f"{_M3}</invoke>\n")


MORE: tuple[Family, ...] = (
    Family("functionary-v3.2", "Functionary v3.2", "meetkai-functionary-medium-v3.2", "llama-bpe", cases=(
        Case("chat", f"all\n{HELLO}", HELLO, source="test-chat.cpp"),
        Case("tools", _V32, calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", _V32 + '>>>special_function_with_opt\n{"arg1": 1, "arg2": 2}', calls=(CALL, CALL2)),
        Case("text before a call", f"all\nLet me check.\n>>>{_V32}", "Let me check.", calls=(CALL,)),
        Case("text after the calls", f"{_V32}>>>all\nDone.", "Done.", calls=(CALL,)),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("minimax-m3", "MiniMax M3", "MiniMax-M3", "llama-spm", cases=(
        Case("chat", f"</mm:think>{HELLO}", HELLO, source="test-chat.cpp"),
        Case("reasoning", f"<mm:think>{THINKING}</mm:think>{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", "</mm:think>" + _M3_CALLS.format(_m3("special_function", arg1=1)), calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", "<mm:think>Calling both</mm:think>" + _M3_CALLS.format(
            _m3("special_function", arg1=1) + _m3("special_function_with_opt", arg1=1, arg2=2)),
             reasoning="Calling both", calls=(CALL, CALL2)),
        Case("text before a call", "<mm:think>Thinking about it</mm:think>Let me call the function."
             + _M3_CALLS.format(_m3("special_function", arg1=1)), "Let me call the function.", "Thinking about it",
             calls=(CALL,), source="test-chat.cpp"),
    )),
)
_GIGA = '{"name": "special_function", "arguments": {"arg1": 1}}'
_GIGA3 = "<|message_sep|>\n\nfunction call<|role_sep|>\n"
_R_PLUS = 'Action:\n```json\n[{}]\n```'
_R_PLUS_CALL = '{{"tool_name": "{}", "parameters": {}}}'
_APERTUS = "<|tools_prefix|>[{}]<|tools_suffix|>"
ONE_CALL = "the template renders one call per turn"
MORE += (
    *(Family(name, label, template, "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", opener + _GIGA, calls=(CALL,), source="test-chat.cpp"),
        Case("text before a call", HELLO + opener + _GIGA, HELLO, calls=(CALL,), source="test-chat.cpp"),
    ), not_supported={"parallel": ONE_CALL, "reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK})
      for name, label, template, opener in (
        ("gigachat3", "GigaChat 3", "GigaChat3-10B-A1.8B", _GIGA3),
        ("gigachat3.1", "GigaChat 3.1", "GigaChat3.1-10B-A1.8B", "<|function_call|>"))),
    Family("command-r-plus", "Command R+ (its template needs each parameter described)",
           "CohereForAI-c4ai-command-r-plus-tool_use", "llama-spm", cases=(
        Case("chat", f"<|CHATBOT_TOKEN|>{HELLO}<|END_OF_TURN_TOKEN|>", HELLO, source="test-chat.cpp"),
        Case("tools", _R_PLUS.format(_R_PLUS_CALL.format("special_function", '{"arg1": 1}')), calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", _R_PLUS.format(_R_PLUS_CALL.format("special_function", '{"arg1": 1}') + ", "
                                        + _R_PLUS_CALL.format("special_function_with_opt", '{"arg1": 1, "arg2": 2}')),
             calls=(CALL, CALL2)),
    ), not_supported={"reasoning": NO_THINK, "budget": NO_THINK, "schema": NO_THINK}),
    Family("apertus", "Apertus", "Apertus-8B-Instruct", "llama-spm", cases=(
        Case("chat", HELLO, HELLO),
        Case("tools", _APERTUS.format('{"special_function": {"arg1": 1}}'), calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", _APERTUS.format('{"special_function": {"arg1": 1}}, '
                                         '{"special_function_with_opt": {"arg1": 1, "arg2": 2}}'), calls=(CALL, CALL2)),
        Case("reasoning", f"<|inner_prefix|>{THINKING}<|inner_suffix|>{HELLO}", HELLO, THINKING),
        Case("call after reasoning", f"<|inner_prefix|>{THINKING}<|inner_suffix|>"
             + _APERTUS.format('{"special_function": {"arg1": 1}}'), reasoning=THINKING, calls=(CALL,)),
        Case("call inside reasoning", "<|inner_prefix|>I should call it."
             + _APERTUS.format('{"special_function": {"arg1": 1}}'), reasoning="I should call it.", calls=(CALL,)),
    )),
)
_APRIEL = '<tool_calls>[{}]</tool_calls>'
_APRIEL_CALL = '{{"name": "{}", "arguments": {}}}'
MORE += (
    Family("apriel", "Apriel 1.6 Thinker", "Apriel-1.6-15b-Thinker-fixed", "llama-spm", opens_think=True, cases=(
        Case("reasoning", f"{THINKING}\n[BEGIN FINAL RESPONSE]\n{HELLO}", HELLO, THINKING, source="test-chat.cpp"),
        Case("tools", f"{THINKING}\n[BEGIN FINAL RESPONSE]\n"
             + _APRIEL.format(_APRIEL_CALL.format("special_function", '{"arg1": 1}')), reasoning=THINKING,
             calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", "[BEGIN FINAL RESPONSE]\n" + _APRIEL.format(
            _APRIEL_CALL.format("special_function", '{"arg1": 1}') + ", "
            + _APRIEL_CALL.format("special_function_with_opt", '{"arg1": 1, "arg2": 2}')), calls=(CALL, CALL2)),
    ), not_supported={"chat": OPENED}),
    Family("minimax-m1", "MiniMax M1", "MiniMax-M1", "llama-spm", cases=(
        Case("chat", HELLO, HELLO),
        Case("reasoning", f"<think>{THINKING}</think>{HELLO}", HELLO, THINKING),
        Case("tools", f"<think>{THINKING}</think>\n<tool_calls>\n" + _APRIEL_CALL.format("special_function",
                                                                                       '{"arg1": 1}')
             + "\n</tool_calls>", reasoning=THINKING, calls=(CALL,)),
        Case("parallel", "<tool_calls>\n" + _APRIEL_CALL.format("special_function", '{"arg1": 1}') + "\n"
             + _APRIEL_CALL.format("special_function_with_opt", '{"arg1": 1, "arg2": 2}') + "\n</tool_calls>",
             calls=(CALL, CALL2)),
    )),
)


def _hy3(name: str, **args: int) -> str:
    return (f"<tool_call:opensource>{name}<tool_sep:opensource>\n" + "".join(
        f"<arg_key:opensource>{k}</arg_key:opensource>\n<arg_value:opensource>{v}</arg_value:opensource>\n"
        for k, v in args.items()) + "</tool_call:opensource>\n")


_HY3 = "<tool_calls:opensource>\n{}</tool_calls:opensource>"
MORE += (
    Family("hy3", "Hunyuan 3", "tencent-Hy3", "llama-spm", cases=(
        Case("chat", HELLO, HELLO),
        Case("reasoning", f"<think:opensource>{THINKING}</think:opensource>{HELLO}", HELLO, THINKING),
        Case("tools", f"<think:opensource>{THINKING}</think:opensource>"
             + _HY3.format(_hy3("special_function", arg1=1)), reasoning=THINKING, calls=(CALL,)),
        Case("parallel", _HY3.format(_hy3("special_function", arg1=1) + _hy3("special_function_with_opt", arg1=1,
                                                                             arg2=2)), calls=(CALL, CALL2)),
    )),
)
_SOLAR = "<|tool_call:begin|>{}<|tool_call:name|>{}<|tool_call:args|>{}<|tool_call:end|>"
_SOLAR_THINK = f"<|think|>{THINKING}<|end|><|begin|>assistant"
MORE += (
    Family("solar-open", "Solar Open", "upstage-Solar-Open-100B", "llama-spm", cases=(
        Case("chat", f"<|content|>{HELLO}<|end|>", HELLO),
        Case("reasoning", f"{_SOLAR_THINK}<|content|>{HELLO}<|end|>", HELLO, THINKING),
        Case("tools", f"{_SOLAR_THINK}<|tool_calls|>" + _SOLAR.format("123456789", "special_function", '{"arg1": 1}'),
             reasoning=THINKING, calls=(CALL,), ids=("123456789",)),
        Case("parallel", "<|tool_calls|>" + _SOLAR.format("000000001", "special_function", '{"arg1": 1}')
             + _SOLAR.format("000000002", "special_function_with_opt", '{"arg1": 1, "arg2": 2}'),
             calls=(CALL, CALL2), ids=("000000001", "000000002")),
    )),
)


def _atem(name: str, **args: int) -> str:
    """A Muse Glimmer call: a message to the function."""
    return (f' to={name}<|message|><atem:function_calls>\n<atem:invoke name="{name}">\n'
            + "".join(f'<atem:parameter name="{k}">{v}</atem:parameter>\n' for k, v in args.items())
            + "</atem:invoke>\n</atem:function_calls>")


_NEXT = "<|eom|><|start|>assistant"
MORE += (
    Family("muse", "Muse Glimmer", "muse-glimmer", "llama-spm", cases=(
        Case("chat", f" to=user<|message|>{HELLO}<|eot|>", HELLO, source="test-chat.cpp"),
        Case("tools", _atem("special_function", arg1=1), calls=(CALL,), source="test-chat.cpp"),
        Case("text before a call", f" to=user<|message|>{HELLO}{_NEXT}" + _atem("special_function", arg1=1), HELLO,
             calls=(CALL,), source="test-chat.cpp"),
        Case("reasoning", f" to=self<|message|>{THINKING}{_NEXT} to=user<|message|>{HELLO}<|eot|>", HELLO, THINKING,
             source="test-chat.cpp"),
        Case("parallel", _atem("special_function", arg1=1) + _NEXT
             + _atem("special_function_with_opt", arg1=1, arg2=2), calls=(CALL, CALL2)),
    )),
)
_TOOLCALL = "<TOOLCALL>[{}]</TOOLCALL>"


def _cpm(name: str, **args: int | str) -> str:
    return f'<function name="{name}">' + "".join(f'<param name="{k}">{v}</param>' for k, v in args.items()) \
        + "</function>"


MORE += (
    Family("apriel-1.5", "Apriel 1.5", "unsloth-Apriel-1.5", "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("tools", _APRIEL.format(_APRIEL_CALL.format("special_function", '{"arg1": 1}')), calls=(CALL,),
             source="test-chat.cpp"),
        Case("parallel", _APRIEL.format(_APRIEL_CALL.format("special_function", '{"arg1": 1}') + ", "
                                        + _APRIEL_CALL.format("special_function_with_opt", '{"arg1": 1, "arg2": 2}')),
             calls=(CALL, CALL2)),
    ), not_supported={f: "its template asks for reasoning as untagged text ended by [BEGIN FINAL RESPONSE] and "
                         "opens nothing in the prompt: no marker says where reasoning starts, so a stream cannot tell "
                         "it from an answer without it (llama.cpp's own test reads such an answer as content)"
                      for f in ("reasoning", "budget", "schema")}),
    Family("nemotron-v2", "Nemotron Nano v2", "NVIDIA-Nemotron-Nano-v2", "llama-spm", opens_think=True, cases=(
        Case("reasoning", f"{THINKING}\n</think>\n{HELLO}", HELLO, THINKING),
        Case("tools", f"{THINKING}\n</think>\n" + _TOOLCALL.format(_APRIEL_CALL.format("special_function",
                                                                                     '{"arg1": 1}')),
             reasoning=THINKING, calls=(CALL,), source="test-chat.cpp"),
        Case("parallel", "</think>" + _TOOLCALL.format(
            _APRIEL_CALL.format("special_function", '{"arg1": 1}') + ", "
            + _APRIEL_CALL.format("special_function_with_opt", '{"arg1": 1, "arg2": 2}')), calls=(CALL, CALL2)),
    ), not_supported={"chat": OPENED}),
    Family("minicpm5", "MiniCPM 5", "openbmb-MiniCPM5-1B", "llama-spm", cases=(
        Case("chat", HELLO, HELLO, source="test-chat.cpp"),
        Case("reasoning", f"<think>\n{THINKING}\n</think>\n\n{HELLO}", HELLO, THINKING),
        Case("tools", _cpm("special_function", arg1=1), calls=(CALL,)),
        Case("parallel", _cpm("special_function", arg1=1) + _cpm("special_function_with_opt", arg1=1, arg2=2),
             calls=(CALL, CALL2)),
        Case("markup in a value", _cpm("special_function", arg1='<![CDATA[<a href="/x">hi</a> & more]]>'),
             calls=(("special_function", {"arg1": '<a href="/x">hi</a> & more'}),)),
    )),
)
