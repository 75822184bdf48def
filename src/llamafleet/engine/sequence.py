"""One running request: its slot, its tokens (prompt then answer), how much of it is in the KV cache (and how much
of that came from the prefix cache), and how its text is produced (detokenizer, stop strings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llamafleet.engine.text import Detokenizer, StopMatcher
from llamafleet.engine.types import CacheOrigin, PromptLogprobs, Request

if TYPE_CHECKING:  # only a type here: the scheduler and its tests import this module without loading llama.cpp
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
    detok: Detokenizer = field(default_factory=Detokenizer)
    stops: StopMatcher = field(init=False)
    # with prompt_logprobs: the prompt's scores, filled as its prefill runs, sent with its first output (then None)
    scores: PromptLogprobs | None = None
    origin: CacheOrigin | None = None  # what the KV tiers gave it (engine/kv_tiers.py), until its first output

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
