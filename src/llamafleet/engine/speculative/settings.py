"""The speculative-decoding settings of one engine: which draft source, how many tokens it may draft, and when.

Pure data, imported by :mod:`llamafleet.engine.types` (``EngineConfig.speculative``); its checks name the key so a
bad value in the fleet's config reads as a config error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SpeculativeMode = Literal["off", "ngram", "draft"]
MAX_DRAFT_LIMIT = 64  # drafted tokens per sequence per step: past this a rejection wastes more than a step saves
MAX_NGRAM = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """``mode``: ``off``, ``ngram`` (prompt lookup: drafts copied from the sequence's own prompt and answer) or
    ``draft`` (a smaller model with the same vocabulary, the GGUF at ``draft_model``, drafts greedily:
    :mod:`llamafleet.engine.speculative.draft_model`).

    ``max_draft`` caps the tokens drafted for one sequence in one step (the policy drafts fewer when its recent
    drafts were rejected); ``ngram_min``..``ngram_max`` are the lengths of the tail looked up, longest first;
    ``max_batch``: speculation only in steps where at most this many sequences decode (beyond, the step is already
    compute-bound and verifying drafts costs more than it saves). ``draft_cost``: one more token's cost as a share
    of a one-token decode step, which decides whether drafts pay (:mod:`llamafleet.engine.speculative.policy`); None
    measures it from the engine's own passes, 0 drafts whenever a draft is found."""

    mode: SpeculativeMode = "off"
    max_draft: int = 8
    ngram_min: int = 2
    ngram_max: int = 4
    max_batch: int = 4
    draft_cost: float | None = None
    draft_model: str | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.mode in ("off", "ngram", "draft"),
             f"speculative.mode must be 'off', 'ngram' or 'draft', not {self.mode!r}"),
            ((self.mode == "draft") == bool(self.draft_model),
             "speculative.draft_model names the draft model's GGUF file, with mode 'draft' and only then: "
             f"mode {self.mode!r} with draft_model {self.draft_model!r}"),
            (1 <= self.max_draft <= MAX_DRAFT_LIMIT,
             f"speculative.max_draft must be between 1 and {MAX_DRAFT_LIMIT}, not {self.max_draft}"),
            (1 <= self.ngram_min <= self.ngram_max <= MAX_NGRAM,
             f"speculative.ngram_min and ngram_max must satisfy 1 <= ngram_min <= ngram_max <= {MAX_NGRAM}, not "
             f"{self.ngram_min} and {self.ngram_max}"),
            (self.max_batch >= 1, f"speculative.max_batch must be >= 1, not {self.max_batch}"),
            (self.draft_cost is None or 0.0 <= self.draft_cost <= 1.0,
             f"speculative.draft_cost must be between 0 and 1 (or unset: measured), not {self.draft_cost}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)

    @property
    def on(self) -> bool:
        return self.mode != "off"
