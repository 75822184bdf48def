"""The consistency check's prompt sets (built-in and from files) and its JSON and markdown reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamafleet.bench.prompts import PromptFileError
from llamafleet.consistency.compare import CPU_THRESHOLDS, Answer, compare_all, summarize
from llamafleet.consistency.prompts import BUILTIN, builtin_prompts, load_prompts
from llamafleet.consistency.report import ConfigResult, Report, to_json, to_markdown

CJK = re.compile(r"[\u4e00-\u9fff]")


def test_builtin_set_is_twenty_business_questions_half_chinese() -> None:
    prompts = builtin_prompts()
    assert len(prompts) == 20 == len({p.text for p in prompts})
    zh = [p for p in prompts if CJK.search(p.text)]
    assert len(zh) == 10 and all(p.label.endswith("(zh)") for p in zh)
    assert all(p.label.endswith("(en)") and p.text.isascii() for p in prompts if p not in zh)
    areas = {area for area, _ in BUILTIN}
    assert {"customer support", "sales", "finance", "logistics"} <= areas
    assert all(sum(a == area for a, _ in BUILTIN) == 2 for area in areas)  # one question per language
    assert all(p.chat == (("user", p.text),) for p in prompts)


def test_prompt_files_become_chat_turns(tmp_path: Path) -> None:
    text = tmp_path / "qs.txt"
    text.write_text("How are invoices approved?\n\n请解释库存周转率。\n", encoding="utf-8")
    assert [(p.label, p.chat) for p in load_prompts(text)] == [
        ("qs.txt #1", (("user", "How are invoices approved?"),)),
        ("qs.txt #2", (("user", "请解释库存周转率。"),)),
    ]
    jsonl = tmp_path / "qs.jsonl"
    lines = [json.dumps("Plain string"), json.dumps({"prompt": "A prompt field"}),
             json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})]
    jsonl.write_text("\n".join(lines), encoding="utf-8")
    assert [p.chat for p in load_prompts(jsonl)] == [
        (("user", "Plain string"),), (("user", "A prompt field"),), (("system", "Be brief."), ("user", "Hi")),
    ]


def test_bad_prompt_files_are_refused_with_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "a.jsonl"
    bad.write_text('"ok"\n{"prompt": 3}\n', encoding="utf-8")
    with pytest.raises(PromptFileError, match="a.jsonl line 2: expected a JSON string"):
        load_prompts(bad)
    with pytest.raises(PromptFileError, match="cannot read"):
        load_prompts(tmp_path / "missing.txt")


def test_reading_prompt_files_loads_no_load_generator() -> None:
    # the prompt-file format is its own small module: the check does not pull in the bench's HTTP client or plots
    code = ("import sys, llamafleet.consistency.prompts; "
            "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('httpx', 'tqdm', 'matplotlib') "
            "or m == 'llamafleet.bench.loadgen'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == ""


def _report() -> Report:
    prompts = builtin_prompts()[:2]
    ref = [Answer((1, 2, 3, 4), (-0.1, -0.2, -0.3, -0.4), "ref one"), Answer((5, 6), (-0.5, -0.6), "ref two")]
    other = [Answer((1, 2, 3, 4), (-0.1, -0.2, -0.3, -0.4)), Answer((5, 7), (-0.5, -0.69), "other two")]
    same = compare_all(ref, ref)
    diff = compare_all(ref, other)
    return Report(
        model="m.gguf", device="CPU (2 threads)", max_tokens=4, thresholds=CPU_THRESHOLDS, prompts=prompts,
        results=[
            ConfigResult("reference", "reference", "CPU", seconds=1.0),
            ConfigResult("batched", "pass", "CPU", summary=summarize(same), comparisons=same),
            ConfigResult("replica-1", "fail", "CPU", summary=summarize(diff), comparisons=diff,
                         failures=["exact-match rate 0.500 < 0.900"], diverged_texts={1: "other two"}),
            ConfigResult("tensor", "skipped", note="tensor split runs over 2 or more GPUs; skipped here (no GPU)"),
        ],
        reference_texts=["ref one", "ref two"],
    )


def test_report_verdict_and_markdown() -> None:
    report = _report()
    assert not report.passed and report.compared == 2
    md = to_markdown(report)
    assert "**Result: FAIL**" in md
    assert "| batched | CPU | **pass** | 1.00 | 1.000 / 1.000 | 0/2 |" in md
    assert "| replica-1 | CPU | **fail** | 0.50 | 0.750 / 0.500 | 1/2 | 1 / 1.0 | 0 |" in md
    assert "- replica-1: exact-match rate 0.500 < 0.900" in md
    assert "- tensor (skipped): tensor split runs over 2 or more GPUs" in md
    assert "### replica-1" in md and "### batched" not in md
    assert "| customer support (zh) | 2 | 2 | 1 | 0.500 | -0.600 / -0.690 |" in md
    report.results = [r for r in report.results if r.status != "fail"]
    assert report.passed and "**Result: PASS**" in to_markdown(report)
    report.results = [r for r in report.results if r.status in ("reference", "skipped")]
    assert report.passed and "nothing was compared" in to_markdown(report)


def test_report_json_holds_every_figure() -> None:
    data = json.loads(to_json(_report()))
    assert data["passed"] is False and data["thresholds"]["max_abs_dlogprob"] == 0.05
    assert data["prompts"][1]["reference_answer"] == "ref two"
    assert data["prompts"][0]["chat"] == [{"role": "user", "content": builtin_prompts()[0].text}]
    fail = data["configs"][2]
    assert fail["summary"]["first_divergence_min"] == 1 and fail["diverged_texts"] == {"1": "other two"}
    assert fail["comparisons"][1]["other_logprob_at_divergence"] == -0.69
    assert [c["status"] for c in data["configs"]] == ["reference", "pass", "fail", "skipped"]
