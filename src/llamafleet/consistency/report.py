"""The consistency check's result: one line per configuration, the overall verdict, JSON and markdown renderings.

A configuration ends in one of five states: ``reference`` (the baseline itself), ``pass``/``fail`` (compared
against the thresholds), ``skipped`` (it cannot run here, e.g. a GPU split on a machine without GPUs; the note says
why) and ``error`` (it was meant to run but could not: load failure, a worker that died). The run passes when no
configuration failed or errored; skipped ones do not count either way.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

from llamafleet.consistency.compare import Comparison, Summary, Thresholds
from llamafleet.consistency.prompts import Prompt

Status = Literal["reference", "pass", "fail", "skipped", "error"]


@dataclass
class ConfigResult:
    """What happened to one configuration."""

    name: str
    status: Status
    placement: str = ""  # where its worker ran: "CPU", "GPU 0", "GPUs 0,1"
    pid: int | None = None  # its worker process
    note: str = ""
    engine: dict[str, object] = field(default_factory=dict)  # the settings that differ between configurations
    seconds: float | None = None  # wall time of its generation (not of loading)
    summary: Summary | None = None
    failures: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    diverged_texts: dict[int, str] = field(default_factory=dict)  # prompt index -> this configuration's answer


@dataclass
class Report:
    """The whole run."""

    model: str
    device: str
    max_tokens: int
    thresholds: Thresholds
    prompts: list[Prompt]
    results: list[ConfigResult]
    reference_texts: list[str] = field(default_factory=list)  # the reference's answer to each prompt
    settings: str = ""  # what every configuration shares (flash attention, KV cache type, threads, context)

    @property
    def passed(self) -> bool:
        return all(r.status in ("reference", "pass", "skipped") for r in self.results)

    @property
    def compared(self) -> int:
        return sum(r.status in ("pass", "fail") for r in self.results)


def to_json(report: Report) -> str:
    data = {
        "model": report.model,
        "device": report.device,
        "max_tokens": report.max_tokens,
        "settings": report.settings,
        "thresholds": asdict(report.thresholds),
        "passed": report.passed,
        "prompts": [
            {"label": p.label, "chat": [{"role": r, "content": c} for r, c in p.chat],
             "reference_answer": report.reference_texts[i] if i < len(report.reference_texts) else None}
            for i, p in enumerate(report.prompts)
        ],
        "configs": [asdict(r) for r in report.results],
    }
    return json.dumps(data, indent=2, ensure_ascii=False)


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _row(r: ConfigResult) -> str:
    s = r.summary
    secs = _f(r.seconds, ".1f")
    if s is None:
        return f"| {r.name} | {r.placement or '–'} | {r.status} | – | – | – | – | – | – | {secs} |"
    first = f"{_f(s.first_divergence_min, 'd')} / {_f(s.first_divergence_mean, '.1f')}"
    return (
        f"| {r.name} | {r.placement} | **{r.status}** | {s.exact_match_rate:.2f} | "
        f"{s.agreement_mean:.3f} / {s.agreement_min:.3f} | {s.diverged}/{s.prompts} | {first} | "
        f"{s.max_abs_dlogprob:.4g} | {s.mean_abs_dlogprob:.3g} | {secs} |"
    )


def _divergences(r: ConfigResult, prompts: list[Prompt]) -> list[str]:
    rows = [
        f"\n### {r.name}\n",
        "| prompt | reference tokens | other tokens | diverged at | agreement | logprob there (ref / other) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for c in r.comparisons:
        if c.divergence is None:
            continue
        there = f"{_f(c.ref_logprob_at_divergence, '.3f')} / {_f(c.other_logprob_at_divergence, '.3f')}"
        rows.append(f"| {prompts[c.prompt].label} | {c.ref_tokens} | {c.other_tokens} | {c.divergence} | "
                    f"{c.agreement:.3f} | {there} |")
    return rows


def to_markdown(report: Report) -> str:
    t = report.thresholds
    lines = [
        "# Consistency report\n",
        f"Model `{report.model}` on {report.device}; {len(report.prompts)} prompts, greedy, up to "
        f"{report.max_tokens} tokens each. Shared settings: {report.settings or 'defaults'}.\n",
        f"Thresholds: exact-match rate >= {t.min_exact_match:.2f}, mean token agreement >= "
        f"{t.min_agreement_mean:.2f}, max |dlogprob| <= {t.max_abs_dlogprob:.4g} (over the shared prefix).\n",
        "| configuration | placement | result | exact match | agreement mean / min | diverged | "
        "first divergence min / mean | max \\|dlogprob\\| | mean \\|dlogprob\\| | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(r) for r in report.results),
        "",
    ]
    verdict = "PASS" if report.passed else "FAIL"
    if report.compared == 0 and report.passed:
        verdict += " (nothing was compared: every configuration besides the reference was skipped)"
    lines.append(f"**Result: {verdict}**\n")
    for r in report.results:
        for why in r.failures:
            lines.append(f"- {r.name}: {why}")
        if r.note:
            lines.append(f"- {r.name} ({r.status}): {r.note}")
    diverged = [r for r in report.results if r.summary is not None and r.summary.diverged]
    if diverged:
        lines.append("\n## Where answers diverged")
        lines.append("A near-tie (both logprobs close to each other and far below 0) is float rounding choosing "
                     "between two almost equally likely tokens; a confident token (logprob near 0) that flips is "
                     "real drift.")
        for r in diverged:
            lines.extend(_divergences(r, report.prompts))
    return "\n".join(lines) + "\n"
