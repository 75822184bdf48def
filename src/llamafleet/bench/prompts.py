"""The prompt-file format shared by ``llamafleet bench`` and ``llamafleet consistency``, and the bench's synthetic
prompts.

A prompt file holds one prompt per non-empty line; when its name ends in ``.jsonl``, each line is a JSON string,
``{"prompt": "..."}`` or ``{"messages": [{"role": ..., "content": ...}, ...]}``. Synthetic prompts are made of
common English words that are one token each in the usual LLaMA-family vocabularies, so a prompt of N words is N
tokens whatever the model. This module imports nothing heavy (no HTTP client, no plotting), so the consistency
check can read prompt files without loading the load generator.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class PromptFileError(ValueError):
    """A prompt file cannot be used; the message names the file, the line where there is one, and the fix."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: plain text (sent as ``prompt``, or as one user message in chat mode) or chat messages."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()


# Common English words that are one token each (after a space) in the LLaMA-2 (SentencePiece), LLaMA-3, SmolLM2,
# GPT-2, Qwen2, Phi-3, MPT and Falcon vocabularies: N of them joined by spaces are exactly N tokens there.
_WORD_LIST = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl food moment air teacher force education"
)
_WORDS = _WORD_LIST.split()


def synthetic_text(words: int, seed: int | str) -> str:
    """``words`` one-token words drawn by a generator seeded with ``seed``: the same seed, the same text."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


@dataclass(frozen=True)
class PromptSet:
    """Prompts from a file (cycled), made by ``make`` for each index (a workload's), or synthetic prompts of
    ``words`` one-token words; the last two differ for every index, so that no server can answer a later request
    from a prefix cache filled by an earlier one."""

    prompts: tuple[Prompt, ...] = ()
    words: int = 128
    source: str = ""
    make: Callable[[int], Prompt] | None = None

    def get(self, index: int) -> Prompt:
        if self.prompts:
            return self.prompts[index % len(self.prompts)]
        if self.make is not None:
            return self.make(index)
        return Prompt(text=synthetic_text(self.words, index))

    def describe(self) -> str:
        return self.source or f"synthetic, {self.words} one-token words"


def load_prompts(path: Path) -> PromptSet:
    """Read a prompt file: ``.jsonl`` lines of a JSON string, ``{"prompt": ...}`` or ``{"messages": [...]}``;
    any other file: one text prompt per non-empty line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PromptFileError(f"--prompts: cannot read {path}: {e.strerror}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompts.append(_jsonl_prompt(path, n, line) if path.suffix == ".jsonl" else Prompt(text=line))
    if not prompts:
        raise PromptFileError(f"--prompts: {path} holds no prompts (expected one per line)")
    return PromptSet(prompts=tuple(prompts), source=f"{path.name} ({len(prompts)} prompts)")


def _jsonl_prompt(path: Path, n: int, line: str) -> Prompt:
    where = f"--prompts: {path.name} line {n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptFileError(f"{where}: not JSON ({e.msg}); use a .txt file for plain text lines") from None
    if isinstance(obj, str):
        return Prompt(text=obj)
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        return Prompt(text=obj["prompt"])
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        msgs = obj["messages"]
        if all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
               for m in msgs) and msgs:
            return Prompt(messages=tuple((m["role"], m["content"]) for m in msgs))
        raise PromptFileError(f"{where}: 'messages' must be a non-empty list of {{'role': str, 'content': str}}")
    raise PromptFileError(f"{where}: expected a JSON string, {{\"prompt\": str}} or {{\"messages\": [...]}}")
