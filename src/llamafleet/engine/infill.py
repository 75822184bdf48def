"""Fill-in-the-middle prompts: the code before and after the cursor (and other files for context) as the tokens a
code model trained for infilling reads, with its own FIM tokens.

Layout (the one llama-server uses, so editor plugins written for it get the same answers)::

    [extra context] [BOS] <FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>

where the model generates what goes between ``prefix prompt`` and ``suffix``. The extra context is, for a model
with the repository-level tokens (``FIM_REP``, ``FIM_SEP``, e.g. Qwen2.5-Coder), ``<FIM_REP>myproject\\n`` then
``<FIM_SEP>{filename}\\n{text}`` per file and ``<FIM_SEP>filename\\n`` for the file being edited; otherwise each
file's text after a plain ``--- snippet ---`` line. Client text is tokenized as plain text, never as special tokens.

What does not fit ``budget`` tokens is cut where it matters least: the prefix keeps its end (the code just before
the cursor), the suffix its start, the extra context its end; the suffix keeps at least a quarter of the room, the
prefix takes the rest it needs, and the extra context what is left. Pure logic over a tokenize callable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SNIPPET = "\n\n--- snippet ---\n\n"  # before each extra file when the model has no file-separator token
REPO = "myproject\n"
CURRENT_FILE = "filename\n"


class NoFimTokens(ValueError):
    """The model has no fill-in-the-middle tokens: it cannot infill."""


@dataclass(frozen=True)
class Infill:
    """An infill request's text: before the cursor (``prefix``, then ``prompt``), after it, and other files
    ((filename, text) pairs)."""

    prefix: str
    suffix: str
    prompt: str = ""
    extra: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids; -1 where it has none."""

    pre: int
    suf: int
    mid: int
    rep: int = -1
    sep: int = -1

    def check(self) -> None:
        missing = [name for name, t in (("FIM_PRE", self.pre), ("FIM_SUF", self.suf), ("FIM_MID", self.mid)) if t < 0]
        if missing:
            raise NoFimTokens(f"this model cannot fill in the middle: its vocabulary has no {', '.join(missing)} "
                              "token(s); serve a code model trained for infilling (Qwen2.5-Coder, CodeLlama, "
                              "StarCoder2, DeepSeek-Coder, ...)")


def infill_tokens(req: Infill, fim: FimTokens, tokenize: Callable[[str], list[int]], budget: int,
                  bos: int | None) -> list[int]:
    """The prompt tokens of ``req`` (``tokenize``: plain text, nothing added), cut to ``budget`` tokens where it can
    be; ``bos``: the BOS to start with, if the model wants one. :class:`NoFimTokens` without the FIM tokens."""
    fim.check()
    prefix, suffix, prompt = tokenize(req.prefix), tokenize(req.suffix), tokenize(req.prompt)
    extra = [fim.rep, *tokenize(REPO)] if fim.rep >= 0 else []
    for filename, text in req.extra:
        extra += [fim.sep, *tokenize(filename + "\n")] if fim.sep >= 0 else tokenize(SNIPPET)
        extra += tokenize(text)
    if fim.sep >= 0:
        extra += [fim.sep, *tokenize(CURRENT_FILE)]
    start = [] if bos is None else [bos]
    room = max(0, budget - len(start) - 3 - len(prompt))
    n_suffix = min(len(suffix), max(room // 4, room - len(prefix)))
    n_prefix = min(len(prefix), room - n_suffix)
    n_extra = min(len(extra), room - n_suffix - n_prefix)
    return [*extra[len(extra) - n_extra:], *start, fim.pre, *prefix[len(prefix) - n_prefix:], *prompt, fim.suf,
            *suffix[:n_suffix], fim.mid]
