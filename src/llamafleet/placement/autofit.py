"""Auto-fit: ``parallel`` and ``context_length`` that the configuration leaves unset are chosen by the planner.

Setting a knob (in the file or by a flag, even to its default) keeps it as set; an unset one is fitted: the planner
tries shapes from the default down and keeps the first whose plan fits (:func:`auto_shapes` gives the order and the
floors). The plan's reasons say what was chosen. Only a model that does not fit even at the floors is refused, with
the planner's usual reasons and fixes; a plan refused by a rule (not by memory) is not retried smaller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.memory import CTX_PAD, pad_ctx
from llamafleet.placement.plan import Plan

# Plans exactly the configuration's shape; also says whether a rule (not memory) refused the plan.
Place = Callable[[ModelInfo, Inventory, FleetConfig], tuple[Plan, bool]]

AUTO_KNOBS_ORDER = ("parallel", "context_length")
AUTO_KNOBS = frozenset(AUTO_KNOBS_ORDER)
AUTO_CTX_FLOOR = 2048  # an unset context_length is never fitted below this (or the trained context, if shorter)


def fit_unset(model: ModelInfo, inventory: Inventory, cfg: FleetConfig, place: Place) -> Plan:
    """``place``'s plan for ``cfg``, with unset ``parallel`` / ``context_length`` fitted: the first shape of
    :func:`auto_shapes` that fits; the plan's second reason says which was chosen and why."""
    auto = AUTO_KNOBS - cfg.model_fields_set
    if not auto:
        return place(model, inventory, cfg)[0]
    shapes = auto_shapes(model, cfg, auto)
    for n_seq, n_ctx in shapes:
        plan, ruled_out = place(model, inventory, cfg.model_copy(update={"parallel": n_seq, "context_length": n_ctx}))
        if plan.fits or ruled_out:  # a rule, not memory, refused it: a smaller shape would not help
            break
    chosen, first = f"{plan.n_seq} slot(s) x {plan.n_ctx_per_seq} tokens", shapes[0]
    unset = " and ".join(k for k in AUTO_KNOBS_ORDER if k in auto)
    if ruled_out:
        note = f"{unset} not set, but no size helps: the plan is refused by a rule"
    elif not plan.fits:
        note = f"{unset} not set: even the floors ({chosen}) do not fit"
    elif (plan.n_seq, plan.n_ctx_per_seq) == (first[0], pad_ctx(first[1])):
        note = f"{unset} not set: {chosen}, the largest auto-fit tries, fit"
    else:
        note = (f"{unset} not set: {chosen}, the most that fit ({first[0]} x {pad_ctx(first[1])} does not); "
                "set them to choose yourself")
    return replace(plan, reasons=(plan.reasons[0], note, *plan.reasons[1:]))


def auto_shapes(model: ModelInfo, cfg: FleetConfig, auto: frozenset[str] | set[str]) -> list[tuple[int, int]]:
    """The (parallel, context_length) shapes auto-fit tries, largest first.

    An unset ``parallel`` goes from its default down to 1 slot; an unset ``context_length`` starts at its default
    (never above the model's trained context, rounded down to llama.cpp's steps of 256) and, once parallel is at
    its floor, goes down in steps of 256 to :data:`AUTO_CTX_FLOOR` (or the trained context if shorter). Slots go
    first: one slot with a long context serves what several short ones cannot.
    """
    top_ctx = cfg.context_length
    if "context_length" in auto:
        top_ctx = pad_ctx(top_ctx)
        if model.n_ctx_train:
            top_ctx = min(top_ctx, max(model.n_ctx_train // CTX_PAD, 1) * CTX_PAD)
    seqs = list(range(cfg.parallel, 0, -1)) if "parallel" in auto else [cfg.parallel]
    shapes = [(n, top_ctx) for n in seqs]
    if "context_length" in auto:
        floor = min(AUTO_CTX_FLOOR, top_ctx)
        shapes += [(seqs[-1], c) for c in range(top_ctx - CTX_PAD, floor - 1, -CTX_PAD)]
    return shapes
