"""One running request: its slot, its tokens (prompt then answer), how much of it is in the KV cache (and how much
of that came from the prefix cache), and how its text is produced (detokenizer, stop strings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llamafleet.engine.speculative.policy import Track
from llamafleet.engine.text import Detokenizer, StopMatcher
from llamafleet.engine.types import CacheOrigin, PromptLogprobs, Request

if TYPE_CHECKING:  # only a type here: the scheduler and its tests import this module without loading llama.cpp
    from llamafleet.engine.budget import ThinkBudget
    from llamafleet.engine.llama_lora import LoraAdapter
    from llamafleet.engine.llama_sampler import SamplerChain


@dataclass(eq=False)
class Sequence:
    req: Request
    slot: int
    chain: SamplerChain | None  # None: plain greedy, sampled for the whole batch at once
    in_graph: bool = False  # plain greedy sampled inside llama.cpp's graph (backend sampling)
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    n_cached: int = 0  # tokens already decoded into the KV cache
    n_reused: int = 0  # prompt tokens whose KV came from the prefix cache (see engine/prefix.py), not computed
    wait_for: tuple[Sequence, int] | None = None  # (sequence, n): not scheduled until it has computed our n tokens
    n_generated: int = 0
    done: bool = False  # out of the batch (finished or cancelled); its slot may still await release
    closed: bool = False  # its last output is made: later tokens of the same step (drafts kept) are dropped
    detok: Detokenizer = field(default_factory=Detokenizer)
    stops: StopMatcher = field(init=False)
    # with prompt_logprobs: the prompt's scores, filled as its prefill runs, sent with its first output (then None)
    scores: PromptLogprobs | None = None
    budget: ThinkBudget | None = None  # a reasoning budget to enforce (engine/budget.py)
    spec: Track | None = None  # speculative decoding's state, when it speculates (engine/speculative/)
    origin: CacheOrigin | None = None  # what the KV tiers gave it (engine/kv_tiers.py), until its first output
    lora: tuple[tuple[LoraAdapter, float], ...] = ()  # the LoRA adapters it decodes with (engine/lora.py)

    def __post_init__(self) -> None:
        self.tokens = list(self.req.prompt_tokens)
        self.stops = StopMatcher(self.req.params.stop)
        p = self.req.params
        if p.prompt_logprobs:
            self.scores = PromptLogprobs(self.tokens[:], top=[] if p.top_logprobs else None)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def n_prompt(self) -> int:
        return len(self.req.prompt_tokens)

    @property
    def pending(self) -> int:
        """Tokens still to feed to llama_decode (1 while generating; more while the prompt is prefilled)."""
        return len(self.tokens) - self.n_cached

    @property
    def n_draft(self) -> int:
        """Drafted tokens fed after its last token in the next (or running) pass."""
        return len(self.spec.draft) if self.spec is not None else 0

    @property
    def drafted(self) -> int:
        """Tokens drafted for it and verified so far (speculative decoding)."""
        return self.spec.drafted if self.spec is not None else 0

    @property
    def accepted(self) -> int:
        """Of those, the tokens the model kept."""
        return self.spec.accepted if self.spec is not None else 0

    def feed(self, k: int) -> list[int]:
        """The ``k`` tokens it puts into the next pass: the next of its own, then its drafts."""
        if self.spec is not None and self.spec.draft:
            return self.tokens[self.n_cached:] + self.spec.draft
        return self.tokens[self.n_cached:self.n_cached + k]
