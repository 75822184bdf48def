"""Verifying drafts: which of a sequence's drafted tokens the target model keeps, from the logits at each position.

The pass that carried a sequence's last token and its ``d`` drafts produced ``d + 1`` rows of logits: row ``i``
predicts the token after draft ``i`` (row 0 the one after the last verified token). The rule walks the rows in
order: it chooses row ``i``'s token exactly as a step without speculation would (argmax for plain greedy; the
sequence's sampler chain otherwise: penalties, logit bias, grammar, temperature, seeded draw), keeps it, and goes on
to row ``i + 1`` only if that token is draft ``i``; the first token that differs (or the one after the last draft)
ends the run. So every kept token is the one the target chooses given the kept tokens before it, and the chain sees
them one at a time, as without speculation.

For sampling this is the standard rejection rule with a draft that proposes one token (its distribution ``q`` is
all on draft ``x``): accept ``x`` with probability ``min(1, p(x) / q(x)) = p(x)``, else draw from the residual
``(p - q)+``, which is ``p`` without ``x``, renormalised. Drawing ``t ~ p`` and keeping it is the same law: ``t = x``
with probability ``p(x)``, and any other token with ``p(t)``. The target's distribution is kept exactly, and with a
seed each row consumes one draw, as a step without speculation does.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llamafleet.engine.llama import Context
from llamafleet.engine.sampling import score
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import TopLogprobs

Kept = tuple[int, float | None, TopLogprobs | None]  # a kept token, its logprob and top alternatives (if asked)


def verify(ctx: Context, s: Sequence, draft: list[int], rows: npt.NDArray[np.float32]) -> list[Kept]:
    """The tokens ``s`` keeps from ``rows`` (``len(draft) + 1`` rows of logits): the drafts the target agreed with,
    then the target's own token where it first disagreed (or after the last draft)."""
    if s.chain is None:  # plain greedy: one argmax over the rows, then the longest matching run
        best = np.argmax(rows, axis=1)
        agree = best[:-1] == np.asarray(draft)
        n = len(draft) if agree.all() else int(np.argmin(agree))
        kept = best[:n + 1].tolist()
    else:
        kept = []
        for i in range(len(draft) + 1):
            kept.append(s.chain.sample(ctx, rows[i]))
            if i == len(draft) or kept[-1] != draft[i]:
                break
    p = s.req.params
    if not p.logprobs:
        return [(t, None, None) for t in kept]
    lps, tops = score(rows[:len(kept)], np.asarray(kept, dtype=np.int64), p.top_logprobs)
    return [(t, float(lps[i]), None if tops is None else tops[i]) for i, t in enumerate(kept)]
