"""A deterministic stand-in for the engine's llama.cpp context: the same calls (launch, wait, logits, the KV
memory operations), with logits that are a pure function of a sequence's tokens up to each position, never of how
the batch is cut. It checks the KV discipline the engine owes a real context: every token is written at the next
free position of its sequence (a draft the engine forgot to roll back fails the next write), and copies and cuts
act on exactly what was written.

The model's vocabulary stays real (the demo model's pieces and sampler chains); only ``vocab`` (a few token ids)
get finite logits, drawn from a seeded generator keyed by the last two tokens and the position modulo ``period``:
answers then repeat stretches of themselves (prompt lookup has drafts to offer) without repeating for ever (some
drafts are rejected).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

from llamafleet.engine.llama import Batch, Candidates, Model

LOW = -1e4  # every token outside ``vocab``: never chosen, probability 0 after a softmax


class FakeContext:
    def __init__(self, model: Model, n_seq: int, n_ctx_per_seq: int, vocab: list[int], scale: float = 2.0,
                 period: int = 5) -> None:
        self.n_vocab = model.n_vocab
        self.n_ctx = n_seq * n_ctx_per_seq
        self.n_ctx_per_seq = n_ctx_per_seq
        self.vocab = np.asarray(vocab)
        self.scale, self.period = scale, period
        self.kv: list[list[int]] = [[] for _ in range(n_seq)]
        self.candidates, self.candidate = Candidates(model.n_vocab), Candidates(1)
        self.backend_sampling = False
        self._rows: dict[tuple[int, int, int], npt.NDArray[np.float32]] = {}
        self._out = np.zeros((0, self.n_vocab), dtype=np.float32)
        self.decodes = 0

    def row(self, history: list[int]) -> npt.NDArray[np.float32]:
        """The logits after ``history``: a function of its last two tokens and its length only."""
        key = (history[-1], history[-2] if len(history) > 1 else -1, len(history) % self.period)
        if key not in self._rows:
            rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
            r = np.full(self.n_vocab, LOW, dtype=np.float32)
            r[self.vocab] = rng.normal(0.0, self.scale, size=len(self.vocab))
            self._rows[key] = r
        return self._rows[key]

    def probs(self, history: list[int]) -> npt.NDArray[np.float64]:
        """The target distribution over ``vocab`` after ``history`` (temperature 1, no truncation)."""
        x = self.row(history)[self.vocab].astype(np.float64)
        e = np.exp(x - x.max())
        return e / e.sum()

    def launch(self, batch: Batch) -> int:
        self.decodes += 1
        out = []
        for i in range(batch.n_tokens):
            seq, pos, tok = int(batch.seq[i]), int(batch.pos[i]), int(batch.token[i])
            kv = self.kv[seq]
            assert pos == len(kv), f"sequence {seq}: token written at {pos} but its KV holds {len(kv)} positions"
            assert pos < self.n_ctx_per_seq, f"sequence {seq}: position {pos} past its context"
            kv.append(tok)
            if batch.logits[i]:
                out.append(self.row(kv))
        self._out = np.stack(out) if out else np.zeros((0, self.n_vocab), dtype=np.float32)
        return 0

    def wait(self) -> None:
        pass

    def logits(self, n_outputs: int) -> npt.NDArray[np.float32]:
        assert n_outputs == len(self._out), f"asked for {n_outputs} rows, the pass made {len(self._out)}"
        return self._out

    def keep_prefix(self, seq: int, n: int) -> bool:
        del self.kv[seq][n:]
        return True

    def copy_sequence(self, src: int, dst: int) -> None:
        self.kv[dst] = list(self.kv[src])

    def use_backend_greedy(self, seq: int, on: bool) -> bool:
        return False

    def close(self) -> None:
        pass


def install(engine: Any, vocab: list[int], **kw: Any) -> FakeContext:
    """Replace ``engine``'s context with a fake one (its real context is closed)."""
    engine.ctx.close()
    fake = FakeContext(engine.model, engine.cfg.n_seq, engine.cfg.n_ctx_per_seq, vocab, **kw)
    engine.ctx = fake
    return fake
