"""What tests/family_cases.py is made of: the tools its outputs call, a raw output and the message read from it
(:class:`Case`), a family's template, tokenizer and cases (:class:`Family`), and the columns of the matrix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SPECIAL = {"type": "function", "function": {
    "name": "special_function", "description": "I'm special",
    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}},
                   "required": ["arg1"]}}}
OPTIONAL = {"type": "function", "function": {
    "name": "special_function_with_opt", "description": "I'm special but have optional stuff",
    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer", "description": "The first."},
                                                    "arg2": {"type": "integer", "description": "The second."}},
                   "required": ["arg1"]}}}  # (descriptions: Command R+'s template needs one for each parameter)
TOOLS = [SPECIAL, OPTIONAL]
HELLO = "Hello, world!\nWhat's up?"
THINKING = "I'm\nthinking"
CALL = ("special_function", {"arg1": 1})
CALL2 = ("special_function_with_opt", {"arg1": 1, "arg2": 2})


@dataclass(frozen=True)
class Case:
    """One raw output and the message read from it."""

    what: str  # the feature it shows (a column of the matrix)
    output: str
    content: str = ""
    reasoning: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    ids: tuple[str, ...] = ()  # the calls' ids, where the family writes them
    source: str = "own"
    # streamed, where a call went out before its arguments broke: (name, arguments as written) and no content
    streamed: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class Family:
    name: str  # as llamafleet.engine.families names it (None: not recognised)
    label: str  # the models, as people know them
    template: str  # models/templates/<template>.jinja in llama.cpp's source
    vocab: str  # models/ggml-vocab-<vocab>.gguf: the family's own where llama.cpp's source has it (qwen2, qwen35,
    # llama-bpe, gemma-4), else LLaMA-2's small one, llama-spm (the family's markers are then text, as the parser
    # reads them anyway; the Command R tokenizer there is the first Command R's, without R7B's markers). The server
    # tests serve every family with LLaMA-2's (sampling under a grammar over 128k-262k tokens costs minutes there);
    # tests/integration/test_family_vocabs.py reads the outputs of the others through their own
    opens_think: bool = False  # its template opens the think block at the end of the prompt
    cases: tuple[Case, ...] = ()
    not_supported: dict[str, str] = field(default_factory=dict)  # feature -> why not


FEATURES = {  # column -> title
    "chat": "plain chat",
    "tools": "tools",
    "parallel": "parallel calls",
    "forced": "forced call",
    "reasoning": "reasoning split",
    "budget": "reasoning budget",
    "schema": "schema after reasoning",
}
NO_THINK = "the family does not think"
OPENED = "the template opens the think block: a plain answer is a reasoning case"


def supported(family: Family, feature: str) -> bool:
    return feature not in family.not_supported
