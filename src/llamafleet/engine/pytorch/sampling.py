"""Choosing each sequence's next token from its logits, with the meanings llama.cpp's sampler chain gives the same
parameters (:mod:`llamafleet.engine.llama_sampler`): logit bias, then penalties (repeat, presence, frequency over the
last ``penalty_last_n`` tokens, prompt included), then top-k, typical-p, top-p, min-p, temperature, and a draw from
the request's own seeded generator; ``temperature == 0`` takes the most likely token after bias and penalties.

Logprobs are the log-softmax of the raw logits, before all of that, as OpenAI reports them. Rows that need nothing
but the most likely token are taken for the whole batch at once.
"""

from __future__ import annotations

import random

import torch

from llamafleet.engine.types import SamplingParams, TopLogprobs


class Draw:
    """One sequence's sampler: its parameters, its generator, and the tokens its penalties count."""

    def __init__(self, params: SamplingParams, prompt: tuple[int, ...], device: torch.device) -> None:
        self.p = params
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(params.seed if params.seed is not None else random.getrandbits(32))
        self.penalised = params.repeat_penalty != 1.0 or bool(params.presence_penalty or params.frequency_penalty)
        self.history = list(prompt)

    @property
    def plain(self) -> bool:
        """Greedy with nothing to change the logits: argmax, batched."""
        return self.p.greedy and not self.penalised and not self.p.logit_bias

    def choose(self, logits: torch.Tensor) -> int:
        """The next token from one row of raw logits ``[vocab]``."""
        p = self.p
        x = logits.clone()
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], device=x.device)
            x[ids] += torch.tensor([b for _, b in p.logit_bias], device=x.device, dtype=x.dtype)
        if self.penalised:
            self._penalise(x)
        if p.greedy:
            return int(torch.argmax(x))
        if 0 < p.top_k < x.numel():
            x[x < torch.topk(x, p.top_k).values[-1]] = -float("inf")
        if p.typical_p < 1.0:
            x = _typical(x, p.typical_p)
        if p.top_p < 1.0:
            x = _top_p(x, p.top_p)
        if p.min_p > 0.0:
            x[x < x.max() + torch.log(torch.tensor(p.min_p, device=x.device))] = -float("inf")
        probs = torch.softmax(x / p.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.gen))

    def saw(self, token: int) -> None:
        if self.penalised:
            self.history.append(token)

    def _penalise(self, x: torch.Tensor) -> None:
        p = self.p
        window = self.history if p.penalty_last_n < 0 else self.history[-p.penalty_last_n:] if p.penalty_last_n else []
        if not window:
            return
        ids, counts = torch.unique(torch.tensor(window, device=x.device), return_counts=True)
        v = x[ids]
        v = torch.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
        x[ids] = v - counts.to(v.dtype) * p.frequency_penalty - p.presence_penalty


def _top_p(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the fewest most likely tokens whose probabilities add up to ``top_p`` (at least one)."""
    sorted_x, order = torch.sort(x, descending=True)
    cum = torch.cumsum(torch.softmax(sorted_x, dim=-1), dim=-1)
    drop = cum - torch.softmax(sorted_x, dim=-1) >= top_p  # the mass before a token already reaches top_p
    sorted_x[drop] = -float("inf")
    return torch.empty_like(x).scatter_(0, order, sorted_x)


def _typical(x: torch.Tensor, mass: float) -> torch.Tensor:
    """Locally typical sampling: the tokens whose surprise is closest to the expected surprise, up to ``mass``."""
    logp = torch.log_softmax(x, dim=-1)
    probs = logp.exp()
    entropy = -(probs * torch.nan_to_num(logp, neginf=0.0)).sum()
    shift = (-logp - entropy).abs()
    order = torch.argsort(shift)
    cum = torch.cumsum(probs[order], dim=-1)
    keep = order[: int((cum < mass).sum()) + 1]
    out = torch.full_like(x, -float("inf"))
    out[keep] = x[keep]
    return out


def sample(logits: torch.Tensor, draws: list[Draw], want: list[int]) -> tuple[list[int], list[float | None],
                                                                             list[TopLogprobs | None]]:
    """The next token of each row of ``logits`` ``[B, vocab]`` (row ``i`` by ``draws[i]``), with the chosen token's
    logprob and the ``want[i]`` most likely tokens' (``want[i] < 0``: no logprobs)."""
    tokens = [0] * len(draws)
    plain = [i for i, d in enumerate(draws) if d.plain]
    if plain:
        best = torch.argmax(logits if len(plain) == len(draws) else logits[plain], dim=-1).tolist()
        for i, t in zip(plain, best, strict=True):
            tokens[i] = int(t)
    for i, d in enumerate(draws):
        if not d.plain:
            tokens[i] = d.choose(logits[i])
        d.saw(tokens[i])
    lps: list[float | None] = [None] * len(draws)
    tops: list[TopLogprobs | None] = [None] * len(draws)
    rows = [i for i, w in enumerate(want) if w >= 0]
    if rows:
        logp = torch.log_softmax(logits[rows], dim=-1)
        for j, i in enumerate(rows):
            lps[i] = float(logp[j, tokens[i]])
            if want[i] > 0:
                v, ids = torch.topk(logp[j], want[i])
                tops[i] = list(zip(ids.tolist(), v.tolist(), strict=True))
    return tokens, lps, tops
