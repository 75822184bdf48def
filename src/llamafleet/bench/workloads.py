"""Workloads where an answer repeats its prompt, besides the random prompts where nothing can be predicted.

``edit``: rewrite a given text with its spelling fixed; ``extract``: copy a requested part of a long document word
for word. Both answer mostly with stretches of the prompt, which prompt lookup (speculative decoding) drafts from;
``random`` (the synthetic one-token-word prompts of :mod:`llamafleet.bench.prompts`) gives it nothing to find. Every
index gets a different text (seeded), so no prefix cache answers a later prompt from an earlier one.
"""

from __future__ import annotations

import random
from typing import Literal

from llamafleet.bench.prompts import Prompt, PromptSet

Workload = Literal["random", "edit", "extract"]
WORKLOADS: tuple[Workload, ...] = ("random", "edit", "extract")

_PARAGRAPHS = (
    "The harbour town wakes before the sun. Fishing boats leave the quay at four, and by six the first crates of "
    "mackerel are stacked beside the market hall. The baker on the corner sells bread to the crews before they sail "
    "and coffee to the traders when they come back.",
    "The old railway line was closed in the sixties and turned into a cycle path. It runs for twenty kilometres "
    "along the river, through two tunnels and over a stone viaduct, and in summer it carries more people than the "
    "trains ever did.",
    "Every spring the school holds a science fair in the gymnasium. Pupils build volcanoes, measure how fast seeds "
    "grow under coloured light, and explain their results to parents who remember doing the same experiments thirty "
    "years ago.",
    "The museum keeps its oldest maps in a room without windows. The air is held at eighteen degrees and half "
    "humidity, visitors wear cotton gloves, and each map is shown for three months before it rests in the dark for "
    "a year.",
    "Our neighbour grows tomatoes on a balcony no wider than a door. She waters them at dawn, feeds them with "
    "nettle tea once a week, and every August she hands bags of fruit over the railing to anyone who passes below.",
    "The mountain hut is open from June to September. It has forty beds in four rooms, serves soup and bread until "
    "nine in the evening, and asks walkers to carry their rubbish back down to the valley.",
    "The city library lends more than books. Members can borrow sewing machines, telescopes, board games and power "
    "drills, and the most popular item last year was a machine that makes pasta by hand.",
    "The bridge was painted red in the year it opened, and it has been painted red ever since. A crew of twelve "
    "works on it all year round: by the time they reach one end, the paint at the other end needs renewing.",
)
_TOPICS = ("the harbour town", "the railway line", "the science fair", "the museum's maps", "the balcony tomatoes",
           "the mountain hut", "the city library", "the red bridge")


def _typos(text: str, rng: random.Random, rate: float = 0.12) -> str:
    """``text`` with about ``rate`` of its longer words misspelt (two letters swapped)."""
    words = text.split(" ")
    for i, w in enumerate(words):
        if len(w) > 4 and w.isalpha() and rng.random() < rate:
            j = rng.randrange(1, len(w) - 2)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


def edit_prompt(index: int) -> Prompt:
    """Rewrite three paragraphs with their spelling fixed: the answer is the prompt's text, nearly unchanged."""
    rng = random.Random(f"edit-{index}")
    text = "\n\n".join(_typos(p, rng) for p in rng.sample(_PARAGRAPHS, 3))
    return Prompt(text=f"Rewrite the following text with its spelling mistakes corrected. Change nothing else and "
                       f"answer with the corrected text only.\n\n{text}\n\nCorrected text:\n\n")


def extract_prompt(index: int) -> Prompt:
    """Copy one paragraph, named by its topic, out of a document of all of them in a shuffled order."""
    rng = random.Random(f"extract-{index}")
    order = rng.sample(range(len(_PARAGRAPHS)), len(_PARAGRAPHS))
    doc = "\n\n".join(_PARAGRAPHS[i] for i in order)
    topic = _TOPICS[rng.choice(order)]
    return Prompt(text=f"Here is a document.\n\n{doc}\n\nCopy the paragraph about {topic} exactly as it is written "
                       f"in the document.\n\nParagraph:\n\n")


def workload_prompts(workload: Workload, words: int = 128) -> PromptSet:
    """The prompts of ``workload``, a different one for every index (``random``: synthetic prompts of ``words``
    one-token words)."""
    if workload == "random":
        return PromptSet(words=words)
    make = edit_prompt if workload == "edit" else extract_prompt
    return PromptSet(make=make, source=f"{workload} workload (a different text for every request)")
