"""The multi-turn workload of ``llamafleet bench multiturn``: conversations that re-send their history, as chat
clients, agents and RAG pipelines do, to measure what a server's prompt (prefix) cache saves.

``conversations`` conversations of ``turns`` turns each share one system prompt of ``system_tokens`` synthetic
one-token words (:mod:`llamafleet.bench.prompts`, so the size is the same in every LLaMA-family vocabulary). Each
turn adds a user line of ``user_tokens`` words, different for every conversation and turn, and sends the whole
history: the system prompt, every earlier user line and every earlier answer *as the server returned it*, then the
new user line. Over ``/v1/completions`` the history is one text::

    System: <system words>
    User: <line 1>
    Assistant:<answer 1>
    User: <line 2>
    Assistant:

so turn t+1's prompt starts with exactly turn t's prompt and answer; with ``chat`` it is a list of messages.
With ``private_tokens`` every conversation's system prompt goes on with a text of its own (a coding agent's files,
a RAG session's documents) that no other conversation shares: with more conversations than the server has slots,
a conversation's next turn finds its KV only if the server kept it beyond the slot (a RAM or disk tier).
Answers are ``max_tokens`` long (greedy, ``ignore_eos`` as in the sweep). ``concurrency`` workers (default: one per
conversation) each take the next conversation and run its turns one after another: turn t+1 is sent when turn t has
finished. With ``by_turn`` the replay goes turn by turn instead, as agents taking turns do: every conversation's
turn t is sent (``concurrency`` at a time) before any turn t+1, so with more conversations than slots a
conversation's slot has served others before its next turn. A failed turn ends its conversation (its later turns
are counted as not sent), and so does ``deadline_s``: no turn is sent after that many seconds of replay (those in
flight finish), so a replay against a slow server fits a bounded call and still reports the turns it made. One turn
per conversation (``turns`` 1) is the shared-prefix case: many users, one long
system prompt, nothing else in common.

The texts come from ``seed`` (a fresh one per run unless given, written to the report), so a second run does not
find the first run's system prompt still cached in the server. :mod:`llamafleet.bench.multiturn_report` makes the
statistics.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from llamafleet.bench.client import Connection
from llamafleet.bench.prompts import synthetic_text
from llamafleet.bench.streaming import RequestResult, Target, counting, run_blocking, send, warm_up

Message = dict[str, str]


@dataclass(frozen=True)
class MultiTurnConfig(Target):
    """The replay: ``conversations`` x ``turns`` requests, ``concurrency`` conversations at a time (``None``: all)."""

    conversations: int = 32
    turns: int = 4
    system_tokens: int = 1300
    user_tokens: int = 25
    private_tokens: int = 0
    concurrency: int | None = None
    seed: int = 0
    by_turn: bool = False
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("conversations", "turns", "user_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.system_tokens < 0 or self.private_tokens < 0:
            raise ValueError("system_tokens and private_tokens must be >= 0 (0: none)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1 (conversations running at once)")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError("deadline_s must be > 0 (seconds after which no turn is sent; None: none)")

    @property
    def workers(self) -> int:
        return min(self.concurrency or self.conversations, self.conversations)


def new_seed() -> int:
    """A seed for a run that gives none: fresh texts, so no server still holds them in its cache."""
    return random.SystemRandom().randrange(1 << 31)


@dataclass
class TurnRecord:
    """One sent turn: the prompt as sent (the rendered text, or the messages) and what came back."""

    prompt: str | list[Message]
    result: RequestResult


@dataclass
class Conversation:
    """One conversation's texts and the turns sent so far. ``answers`` holds the answers the server returned, and
    they are what the next turn re-sends."""

    index: int
    system: str
    user_lines: list[str]  # one per turn, made up front
    answers: list[str] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)

    @classmethod
    def make(cls, cfg: MultiTurnConfig, index: int) -> Conversation:
        """Conversation ``index``: the shared system text, then its private one (if any), and its user lines."""
        parts = [synthetic_text(cfg.system_tokens, f"{cfg.seed}/system"),
                 synthetic_text(cfg.private_tokens, f"{cfg.seed}/private/{index}")]
        return cls(index, "\n\n".join(p for p in parts if p),
                   [synthetic_text(cfg.user_tokens, f"{cfg.seed}/user/{index}/{t}") for t in range(cfg.turns)])

    @property
    def next_turn(self) -> int:
        """The turn to send next, from 0."""
        return len(self.turns)

    def messages(self) -> list[Message]:
        """The history for the next turn as chat messages: system, then user and assistant in turn, then the new
        user line."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for t in range(self.next_turn + 1):
            msgs.append({"role": "user", "content": self.user_lines[t]})
            if t < self.next_turn:
                msgs.append({"role": "assistant", "content": self.answers[t]})
        return msgs

    def text(self) -> str:
        """The history for the next turn as one plain text; each answer follows its ``Assistant:`` exactly as it
        came back, so the text of every turn starts with the text of the turn before and its answer."""
        lines = [f"System: {self.system}"] if self.system else []
        for t in range(self.next_turn + 1):
            lines.append(f"User: {self.user_lines[t]}")
            lines.append(f"Assistant:{self.answers[t]}" if t < self.next_turn else "Assistant:")
        return "\n".join(lines)

    def request(self, cfg: MultiTurnConfig) -> tuple[str | list[Message], dict[str, Any]]:
        """The next turn's prompt and the request body that carries it."""
        body = cfg.body()
        prompt: str | list[Message]
        if cfg.chat:
            prompt = body["messages"] = self.messages()
        else:
            prompt = body["prompt"] = self.text()
        return prompt, body

    def record(self, prompt: str | list[Message], result: RequestResult) -> None:
        """Keep a sent turn; a successful one's answer joins the history."""
        self.turns.append(TurnRecord(prompt, result))
        if result.ok:
            self.answers.append(result.text)

    @property
    def finished(self) -> bool:
        """All turns sent, or stopped by a failed one."""
        return len(self.user_lines) == self.next_turn or any(not t.result.ok for t in self.turns)


@dataclass
class MultiTurnRun:
    """Every conversation, and the replay's wall time (first send to last answer) and client CPU share."""

    conversations: list[Conversation]
    wall_seconds: float
    client_cpu_share: float = 0.0

    def results(self, turn: int | None = None) -> list[RequestResult]:
        """The results of one turn (from 0), or of all turns."""
        return [r.result for c in self.conversations for t, r in enumerate(c.turns) if turn is None or t == turn]


def _warmup_body(cfg: MultiTurnConfig, i: int) -> dict[str, Any]:
    """A short request sharing no text with the replay (the warm-up must not put the system prompt in a cache)."""
    text = synthetic_text(16, f"{cfg.seed}/warmup/{i}")
    body = cfg.body()
    if cfg.chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


async def run_async(cfg: MultiTurnConfig, progress: bool = True) -> MultiTurnRun:
    """Warm up, then replay every conversation."""
    await warm_up(cfg, lambda i: _warmup_body(cfg, i))
    conversations = [Conversation.make(cfg, i) for i in range(cfg.conversations)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    with tqdm(total=cfg.conversations * cfg.turns, desc=f"{cfg.conversations} conversations x {cfg.turns} turns",
              unit="req", disable=not progress, leave=True) as bar:
        tick = counting(bar)

        async def worker(conn: Connection, waiting: Iterator[Conversation]) -> None:
            for conv in waiting:
                while not conv.finished:
                    if cfg.deadline_s is not None and time.perf_counter() - t0 >= cfg.deadline_s:
                        return
                    prompt, body = conv.request(cfg)
                    res = await send(conn, cfg, body)
                    conv.record(prompt, res)
                    tick(res)
                    if cfg.by_turn:
                        break

        conns = [cfg.connection() for _ in range(cfg.workers)]
        try:
            for _ in range(cfg.turns if cfg.by_turn else 1):
                waiting = iter([c for c in conversations if not c.finished])  # shared: each takes the next one
                await asyncio.gather(*(worker(conn, waiting) for conn in conns))
        finally:
            for conn in conns:
                await conn.close()
    wall = time.perf_counter() - t0
    return MultiTurnRun(conversations, wall, (time.process_time() - cpu0) / wall if wall else 0.0)


def run(cfg: MultiTurnConfig, progress: bool = True) -> MultiTurnRun:
    """Blocking wrapper of :func:`run_async`."""
    return run_blocking(run_async(cfg, progress))
