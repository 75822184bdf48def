"""Model families: how a model writes its thinking and its tool calls, recognised from its chat template.

Reasoning and tool-calling models each use their own markup, and their chat template spells it (the template has to
render earlier turns' calls and thinking the way the model wrote them). So the family is read from the template's
source once, at load (:func:`detect`): the markers it contains decide. What a family holds is data only: its think
markers, the name of its call format (parsed by :mod:`llamafleet.api.call_formats`, forced by
:mod:`llamafleet.api.call_grammar`), the markers that open its calls, and markup that frames an answer without being
part of it. A template that names none of these markers is no family (None): such a model gets the generic path
(tools listed in the system prompt, ``<tool_call>`` JSON or plain JSON calls, no reasoning split).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    calls: str  # the call format: a key of MARKUP (read by api/call_formats.py, forced by api/call_grammar.py)
    think: tuple[str, str] | None = None  # the markers around the thinking (open, close)
    openers: tuple[str, ...] = ()  # text that starts the calls (held from there on while streaming)
    drop: tuple[str, ...] = ()  # markup around the answer that is not part of it
    lead: str = ""  # what the template's generation prompt ends with and the answer goes on from (Functionary v3.2's
    # ">>>": the answer's text is read as starting with it)
    text: str = ""  # what the answer writes before plain text, after the lead (Functionary v3.2's "all\n")
    efforts: tuple[tuple[str, str], ...] = ()  # its template takes ``reasoning_effort`` itself: the value it takes
    # for each effort a request may give (gpt-oss's low, medium, high; Hunyuan 3's no_think, low, high)
    bare_close: bool = False  # an answer without thinking may open with the close marker alone (MiniMax M3's)
    budget: str = ""  # its template's variable for the reasoning budget in tokens, given the request's budget
    # (Seed-OSS's thinking_budget: the template tells the model how many tokens it may think)
    switch: tuple[str, object, object] = ("enable_thinking", True, False)  # the template's variable that turns
    # thinking on and off, and its two values (Qwen's, DeepSeek's, GLM's enable_thinking; MiniMax M3's thinking_mode)

    @property
    def reasons(self) -> bool:
        return self.think is not None


THINK = ("<think>", "</think>")
_DEEPSEEK_OPEN = "<｜tool▁calls▁begin｜>"
_KIMI_OPEN = "<|tool_calls_section_begin|>"
_DSML = "｜DSML｜"
M3 = "]<]minimax[>["  # MiniMax M3's namespace, before each of its call tags


def _levels(none: str, low: str, medium: str, high: str) -> tuple[tuple[str, str], ...]:
    """A template's own effort levels for the efforts a request may give."""
    return (("none", none), ("minimal", low), ("low", low), ("medium", medium), ("high", high), ("xhigh", high),
            ("max", high))


def _hy(tag: str) -> str:
    """Hunyuan 3's tags, named with its ``:opensource`` suffix."""
    return f"<{tag}:opensource>"


def _k3(tag: str, close: bool = False) -> str:
    """Kimi K3's tags, built from ``<|open|>``, ``<|close|>`` and ``<|sep|>``."""
    return f"<|{'close' if close else 'open'}|>{tag}<|sep|>"


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("hermes", "json", openers=("<tool_call>",)),
    Family("qwen3", "json", THINK, openers=("<tool_call>",)),
    Family("qwen3-coder", "xml", openers=("<tool_call>",)),
    Family("qwen3.5", "xml", THINK, openers=("<tool_call>",)),
    Family("llama3", "json", openers=("<|python_tag|>",)),
    Family("mistral", "mistral", openers=("[TOOL_CALLS]",)),
    Family("mistral-args", "mistral-args", openers=("[TOOL_CALLS]",)),
    Family("magistral", "mistral-args", ("[THINK]", "[/THINK]"), openers=("[TOOL_CALLS]",)),
    Family("deepseek-r1", "deepseek-r1", THINK, openers=(_DEEPSEEK_OPEN,)),
    Family("deepseek-v3", "deepseek", THINK, openers=(_DEEPSEEK_OPEN,)),
    Family("glm", "glm", THINK, openers=("<tool_call>",)),
    Family("kimi", "kimi", openers=(_KIMI_OPEN,)),
    Family("kimi-thinking", "kimi", THINK, openers=(_KIMI_OPEN,)),
    Family("granite", "granite", THINK, openers=("<|tool_call|>",), drop=("<response>", "</response>")),
    Family("think", "json", THINK, openers=("<tool_call>",)),
    Family("gemma4", "gemma", ("<|channel>thought", "<channel|>"), openers=("<|tool_call>",)),
    Family("command-r7b", "cohere", ("<|START_THINKING|>", "<|END_THINKING|>"), openers=("<|START_ACTION|>",),
           drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>")),
    Family("minimax-m2", "minimax", THINK, openers=("<minimax:tool_call>",)),
    Family("seed-oss", "seed", ("<seed:think>", "</seed:think>"), openers=("<seed:tool_call>",),
           budget="thinking_budget"),
    Family("kimi-k3", "kimi3", (_k3("think"), _k3("think", True)), openers=(_k3("tools"),),
           drop=(_k3("response"), _k3("response", True), _k3("message", True))),
    Family("deepseek-v3.2", "dsml", THINK, openers=(f"<{_DSML}function_calls>",)),
    Family("deepseek-v4", "dsml", THINK, openers=(f"<{_DSML}tool_calls>",)),
    Family("functionary", "functionary", openers=("<function=",)),
    Family("firefunction", "firefunction", openers=("functools[",)),
    Family("lfm2", "pythonic", openers=("<|tool_call_start|>",)),
    Family("lfm2-think", "pythonic", THINK, openers=("<|tool_call_start|>",)),
    Family("lfm2.5", "pythonic", THINK, openers=("<|tool_call_start|>",)),  # its template names no marker of them
    Family("functionary-v3.2", "recipient", openers=(">>>",), drop=(">>>all\n",), lead=">>>", text="all\n"),
    Family("gigachat3", "gigachat", openers=("<|message_sep|>\n\nfunction call<|role_sep|>\n",),
           drop=("<|message_sep|>",)),  # (it ends each message)
    Family("gigachat3.1", "gigachat", openers=("<|function_call|>",)),
    Family("command-r-plus", "cohere-plus", openers=("Action:",), drop=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    Family("apertus", "apertus", ("<|inner_prefix|>", "<|inner_suffix|>"), openers=("<|tools_prefix|>",)),  # (its
    # deliberation: the template renders thoughts after <|inner_prefix|>, the response after <|inner_suffix|>)
    Family("apriel", "apriel", ("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"), openers=("<tool_calls>",)),
    Family("hy3", "hy3", (_hy("think"), _hy("/think")), openers=(_hy("tool_calls"),),
           efforts=_levels("no_think", "low", "high", "high")),
    Family("solar-open", "solar", ("<|think|>", "<|end|>"), openers=("<|tool_calls|>",),
           drop=("<|begin|>assistant", "<|content|>", "<|end|>")),
    # Muse Glimmer: each message names its recipient (self: reasoning; user: the answer; a function: a call)
    Family("muse", "atem", (" to=self<|message|>", "<|eom|><|start|>assistant"), openers=(" to=",),
           drop=("<|start|>assistant", " to=user<|message|>", "<|eot|>", "<|eom|>"), text=" to=user<|message|>"),
    Family("apriel-1.5", "apriel", openers=("<tool_calls>",)),  # (its reasoning: untagged text before its answer)
    Family("nemotron-v2", "toolcall", THINK, openers=("<TOOLCALL>",)),
    Family("minicpm5", "minicpm", THINK, openers=('<function name="',)),
    Family("minimax-m1", "minimax-m1", THINK, openers=("<tool_calls>",)),  # (its template shows no thinking; it thinks)
    Family("minimax-m3", "minimax3", ("<mm:think>", "</mm:think>"), openers=(f"{M3}<tool_call>",),
           drop=("</mm:think>",), bare_close=True, switch=("thinking_mode", "enabled", "disabled")),
    # gpt-oss (OpenAI's harmony format): channels; a call names its recipient, in the channel or the role header
    Family("gpt-oss", "harmony", ("<|channel|>analysis<|message|>", "<|end|>"),
           openers=("to=functions.", "<|channel|>commentary to=", "<|channel|>analysis to="),
           drop=("<|start|>assistant", "<|channel|>final<|message|>", "<|channel|>commentary<|message|>",
                 "<|channel|>final <|constrain|>json<|message|>", "<|return|>"),
           efforts=_levels("low", "low", "medium", "high")),
)}


MARKUP: dict[str, tuple[str, ...]] = {  # what each call format writes besides its openers
    "json": ("</tool_call>",),
    "mistral": (),
    "mistral-args": ("[ARGS]", "[CALL_ID]"),
    "xml": ("</tool_call>",),
    "glm": ("</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    "deepseek": ("<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"),
    "deepseek-r1": ("<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"),
    "kimi": ("<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
             "<|tool_call_end|>"),
    "granite": (),
    "functionary": ("</function>",),
    "firefunction": (),
    "pythonic": ("<|tool_call_end|>",),
    "recipient": (),
    "gigachat": ("<|role_sep|>",),
    "cohere-plus": ("```json", "```"),
    "apertus": ("<|tools_suffix|>",),
    "apriel": ("</tool_calls>",),
    "minimax-m1": ("</tool_calls>",),
    "toolcall": ("</TOOLCALL>",),
    "minicpm": ("</function>", "<param name=", "</param>"),
    "atem": ("<|message|>", "<atem:function_calls>", "</atem:function_calls>", "<atem:invoke name=", "</atem:invoke>",
             "<atem:parameter name=", "</atem:parameter>"),
    "solar": ("<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>"),
    "hy3": tuple(_hy(t) for t in ("/tool_calls", "tool_call", "/tool_call", "tool_sep", "arg_key", "/arg_key",
                                  "arg_value", "/arg_value")),
    "minimax3": (f"{M3}</tool_call>", f"{M3}<invoke name=", f"{M3}</invoke>"),
    "gemma": ("<tool_call|>", '<|"|>'),
    "cohere": ("<|END_ACTION|>",),
    "minimax": ("</minimax:tool_call>", "<invoke name=", "</invoke>", "<parameter name=", "</parameter>"),
    "seed": ("</seed:tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"),
    "kimi3": (_k3("tools", True), "<|open|>call", _k3("call", True), "<|open|>argument", _k3("argument", True)),
    "dsml": (f"</{_DSML}function_calls>", f"</{_DSML}tool_calls>", f"<{_DSML}invoke", f"</{_DSML}invoke>",
             f"<{_DSML}parameter", f"</{_DSML}parameter>"),
    "harmony": ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>"),
}


def markers(family: Family) -> tuple[str, ...]:
    """Every marker the family writes in an answer."""
    return (*(family.think or ()), *family.openers, *family.drop, *MARKUP[family.calls])


def detect(source: str | None) -> Family | None:
    """The family whose markup the template ``source`` spells; None when it spells none this server knows."""
    if not source:
        return None
    has = source.__contains__
    think = has("<think>")
    if has("<|channel|>"):
        return FAMILIES["gpt-oss"]
    if has(M3):
        return FAMILIES["minimax-m3"]
    if has(_DSML):  # the calls section: V3.2's function_calls, V4's tool_calls
        return FAMILIES["deepseek-v4" if has("'tool_calls>") else "deepseek-v3.2"]
    for marker, name in (("<|tool_call>", "gemma4"), ("<|START_ACTION|>", "command-r7b"),
                         ("<minimax:tool_call>", "minimax-m2"), ("<seed:tool_call>", "seed-oss")):
        if has(marker):
            return FAMILIES[name]
    if has("<|role_sep|>") and has("function call"):  # GigaChat 3.1 writes its own token before a call, 3 a role
        return FAMILIES["gigachat3.1" if has("<|function_call|>") else "gigachat3"]
    if has("<|CHATBOT_TOKEN|>") and has("Action:"):  # Command R+ (R7B's <|START_ACTION|> is read above)
        return FAMILIES["command-r-plus"]
    if has("<|tools_prefix|>"):
        return FAMILIES["apertus"]
    if has("[BEGIN FINAL RESPONSE]") and has("<tool_calls>"):  # Apriel 1.6: the prompt opens the reasoning
        return FAMILIES["apriel" if has("Here are my reasoning steps") else "apriel-1.5"]
    if has("<TOOLCALL>"):
        return FAMILIES["nemotron-v2"]
    if has('<function name="') and has('<param name="'):
        return FAMILIES["minicpm5"]
    if has("<tool_calls{}>") and has(":opensource"):  # Hunyuan 3: its tags named as '<tool_calls{}>'.format(...)
        return FAMILIES["hy3"]
    if has("<atem:function_calls>"):
        return FAMILIES["muse"]
    if has("<|tool_call:begin|>"):
        return FAMILIES["solar-open"]
    if has("<tool_calls>") and has("<beginning_of_sentence>"):
        return FAMILIES["minimax-m1"]
    if has("<|open|>") and has("<|close|>") and has("<|sep|>"):
        return FAMILIES["kimi-k3"]
    if has("functools["):
        return FAMILIES["firefunction"]
    if has("<|tool_call_start|>") or has("<|tool_list_start|>"):  # LFM2 (the model writes the calls' markers)
        return FAMILIES["lfm2-think" if think else "lfm2"]
    if has("List of tools: ["):  # LFM2.5 Instruct: the tools listed plainly, the calls in LFM2's markers
        return FAMILIES["lfm2.5"]
    if has("<|start_header_id|>") and has("'>>>'"):  # Functionary v3.2: ">>>name" opens a call, ">>>all" text
        return FAMILIES["functionary-v3.2"]
    if has("<|start_header_id|>") and has("'<function='"):
        return FAMILIES["functionary"]
    if has(_DEEPSEEK_OPEN):
        return FAMILIES["deepseek-r1" if has("```json") else "deepseek-v3"]
    if has(_KIMI_OPEN):
        return FAMILIES["kimi-thinking" if think else "kimi"]
    if has("[TOOL_CALLS]"):
        return FAMILIES["magistral" if has("[THINK]") else "mistral-args" if has("[ARGS]") else "mistral"]
    if has("<arg_key>"):
        return FAMILIES["glm"]
    if has("<|tool_call|>"):
        return FAMILIES["granite"]
    if has("<tool_call>") and has("<function="):
        return FAMILIES["qwen3.5" if think else "qwen3-coder"]
    if has("<tool_call>"):
        return FAMILIES["qwen3" if think else "hermes"]
    if has("<|python_tag|>") or (has("<|start_header_id|>") and has("tools")):
        return FAMILIES["llama3"]
    if think:
        return FAMILIES["think"]
    return None
