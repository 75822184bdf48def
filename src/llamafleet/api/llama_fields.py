"""llama-server's own request fields, which clients written for it send to every route (its web UI, llama.vim,
agents, its Python examples): what each means here.

* honoured (:class:`LlamaServerFields`, the OpenAI routes): ``n_predict`` (the token limit, -1 = until the context
  ends; it must agree with ``max_tokens`` when both are sent), ``n_probs`` (top alternatives per token: logprobs with
  that many, unless the OpenAI fields ask already), ``repeat_last_n`` (the repeat penalties' window, -1 = the whole
  context, 0 = off), ``lora`` (LoRA adapters with their scales, :mod:`llamafleet.fleet.adapters`), ``n_cmpl``
  (completions per prompt: OpenAI's ``n``, which it must agree with when both are sent) and ``json_schema`` (the
  answer is JSON that the schema admits: OpenAI's ``response_format`` of type ``json_schema``);
* accepted, no effect (:class:`LlamaServerNoOps`, every llama-server-shaped route): ``cache_prompt`` (the prefix cache
  is always on, and reusing it changes no answer), ``id_slot`` (the router picks the replica and slot), ``samplers``
  (the engine's sampler order applies), time limits (``t_max_predict_ms``, ``t_max_prompt_ms``), context shifting
  (``n_keep``, ``n_discard``: a prompt that does not fit is refused, never shifted), ``n_indent``, ``min_keep``,
  ``n_cache_reuse``, ``backend_sampling``, and extra output this server does not write (``timings_per_token``,
  ``return_tokens``, ``return_progress``, ``post_sampling_probs``, ``verbose``);
* refused unless at their neutral values, because their samplers are not in this server's chain and an answer
  sampled without them would pass for one sampled with them: ``mirostat``, ``dynatemp_range``, ``xtc_probability``,
  ``dry_multiplier``, ``top_n_sigma`` (their companion fields, such as ``mirostat_tau``, are accepted: they do
  nothing while the sampler is off).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from llamafleet.api.errors import ApiError, NotYet
from llamafleet.api.protocol import DEFAULTS, MAX_CHOICES, Request
from llamafleet.engine.types import MAX_TOP_LOGPROBS

NOT_IN_CHAIN = "this server's sampler chain has no such sampler; leave it at its default ({})"


def checked_n_predict(v: int | None) -> int | None:
    if v == 0:
        raise ValueError("n_predict must be -1 (until the context ends) or at least 1")
    return v


class LoraChoice(Request):
    """One entry of llama-server's ``lora`` list: an adapter by its position in ``GET /lora-adapters`` (or its
    name), and its scale (default: the adapter's configured scale; 0: off)."""

    id: int | str
    scale: float | None = Field(None, allow_inf_nan=False)

    @property
    def pair(self) -> tuple[int | str, float | None]:
        return self.id, self.scale


class LlamaServerNoOps(Request):
    """llama-server's fields that change nothing here (see the module's docstring)."""

    cache_prompt: bool | None = None
    id_slot: int | None = None
    samplers: list[str] | str | None = None
    t_max_predict_ms: int | None = None
    t_max_prompt_ms: int | None = None
    n_keep: int | None = None
    n_discard: int | None = None
    n_indent: int | None = None
    min_keep: int | None = None
    n_cache_reuse: int | None = None
    backend_sampling: bool | None = None
    timings_per_token: bool | None = None
    return_tokens: bool | None = None
    return_progress: bool | None = None
    post_sampling_probs: bool | None = None
    verbose: bool | None = None


class LlamaServerFields(LlamaServerNoOps):
    """llama-server's fields on the OpenAI routes: those honoured, the no-ops, and samplers refused unless off."""

    n_predict: int | None = Field(None, ge=-1, description="-1: until the context ends")
    n_probs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    repeat_last_n: int = Field(DEFAULTS.penalty_last_n, ge=-1)
    mirostat: int = Field(0, ge=0, le=2)
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dynatemp_range: float = 0.0
    dynatemp_exponent: float | None = None
    xtc_probability: float = 0.0
    xtc_threshold: float | None = None
    dry_multiplier: float = 0.0
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    top_n_sigma: float = -1.0
    lora: list[LoraChoice] | None = None  # LoRA adapters with their scales (fleet/adapters.py)
    n_cmpl: int | None = Field(None, ge=1, le=MAX_CHOICES)  # OpenAI's n
    json_schema: dict[str, Any] | None = None  # OpenAI's response_format json_schema

    @field_validator("n_predict")
    @classmethod
    def _predict(cls, v: int | None) -> int | None:
        return checked_n_predict(v)

    @model_validator(mode="after")
    def _n_predict(self) -> Any:
        """``n_predict`` becomes ``max_tokens`` (None: until the context ends), which it must agree with if sent."""
        if self.n_predict is None:
            return self
        limit = None if self.n_predict < 0 else self.n_predict
        for name in ("max_tokens", "max_completion_tokens"):
            if name in self.model_fields_set and getattr(self, name) != limit:
                raise ApiError(400, f"invalid 'n_predict': n_predict ({self.n_predict}) and {name} "
                                    f"({getattr(self, name)}) disagree; send one of them", param="n_predict")
        setattr(self, "max_tokens", limit)  # noqa: B010 - every request model with these fields has max_tokens
        return self

    @model_validator(mode="after")
    def _n_cmpl(self) -> Any:
        """``n_cmpl`` becomes ``n``, which it must agree with if sent."""
        if self.n_cmpl is None:
            return self
        n = self.__dict__["n"]  # every request model with these fields has n
        if "n" in self.model_fields_set and n != self.n_cmpl:
            raise ApiError(400, f"invalid 'n_cmpl': n_cmpl ({self.n_cmpl}) and n ({n}) disagree; send one of them",
                           param="n_cmpl")
        setattr(self, "n", self.n_cmpl)  # noqa: B010 - every request model with these fields has n
        return self

    def samplers_off(self) -> NotYet:
        """The samplers this server does not have, as ``not_yet`` entries: refused unless at their defaults."""
        return [
            ("mirostat", self.mirostat != 0, NOT_IN_CHAIN.format(0)),
            ("dynatemp_range", self.dynatemp_range != 0, NOT_IN_CHAIN.format(0)),
            ("xtc_probability", self.xtc_probability != 0, NOT_IN_CHAIN.format(0)),
            ("dry_multiplier", self.dry_multiplier != 0, NOT_IN_CHAIN.format(0)),
            ("top_n_sigma", self.top_n_sigma not in (-1.0, 0.0), NOT_IN_CHAIN.format(-1)),
        ]
