"""The prompts ``llamafleet consistency`` runs: 20 built-in business questions, or a file of the user's own.

The built-in set has one English and one Chinese question for each of ten business areas (customer support, sales,
finance, logistics, HR, marketing, procurement, IT support, legal, product), so both a Latin and a CJK vocabulary
path are exercised. A file uses the prompt-file format shared with ``llamafleet bench``
(:mod:`llamafleet.bench.prompts`): one prompt per line, or, when its name ends in ``.jsonl``, one JSON value per line
(a string, ``{"prompt": "..."}`` or ``{"messages": [...]}``). Every prompt
becomes chat turns that the worker passes through the model's chat template.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamafleet.bench import prompts as prompt_file
from llamafleet.fleet.messages import ChatTurn

BUILTIN: tuple[tuple[str, str], ...] = (  # (area, question)
    ("customer support", "A customer says their order arrived damaged. Write a short, polite reply that offers a "
                         "replacement or a refund."),
    ("customer support", "客户投诉说退款已经申请了两周还没有到账，请写一段礼貌的回复，说明原因和处理进度。"),
    ("sales", "Give three questions a salesperson should ask in a first call with a small manufacturing company."),
    ("sales", "请为一款面向中小企业的客户关系管理软件写一段简短的销售介绍。"),
    ("finance", "Explain the difference between gross margin and net margin, with a simple example."),
    ("finance", "公司第三季度收入增长了百分之十五，但现金流下降了。请列出三个可能的原因。"),
    ("logistics", "What are the main trade-offs between air freight and sea freight for shipping electronics?"),
    ("logistics", "一批货物在海关被延误了三天，请写一封通知客户的邮件，说明新的预计送达时间。"),
    ("human resources", "Draft a short announcement telling employees about a new flexible working policy."),
    ("human resources", "请列出新员工入职第一周应该完成的五件事情。"),
    ("marketing", "Suggest a subject line and two sentences for an email announcing a spring discount."),
    ("marketing", "请为一家新开的咖啡店设计三条社交媒体宣传文案。"),
    ("procurement", "How should a company compare three suppliers' quotes that differ in price and delivery time?"),
    ("procurement", "采购部门如何降低原材料成本？请给出三条具体建议。"),
    ("it support", "An employee cannot connect to the office VPN. List the first troubleshooting steps."),
    ("it support", "请解释什么是双重身份验证，以及公司为什么应该启用它。"),
    ("legal", "Summarize in plain words what a non-disclosure agreement is for."),
    ("legal", "签订供货合同时，应该特别注意哪些条款？请简要说明。"),
    ("product", "Write a one-paragraph release note for a mobile app update that fixes login problems."),
    ("product", "用户反馈说我们的应用加载太慢，请提出三个改进方案。"),
)


@dataclass(frozen=True)
class Prompt:
    """One prompt: a label for reports and the chat turns sent to the model."""

    label: str
    chat: tuple[ChatTurn, ...]

    @property
    def text(self) -> str:
        """The last turn's content (what a person would call the question)."""
        return self.chat[-1][1]


def builtin_prompts() -> list[Prompt]:
    """The 20 built-in business questions, English and Chinese alternating."""
    return [Prompt(f"{area} ({'zh' if i % 2 else 'en'})", (("user", text),)) for i, (area, text) in enumerate(BUILTIN)]


def load_prompts(path: str | Path) -> list[Prompt]:
    """Read a prompt file (:func:`llamafleet.bench.prompts.load_prompts`); a text prompt becomes one user turn.
    Raises :class:`~llamafleet.bench.prompts.PromptFileError` naming the file, the line and the fix."""
    p = Path(path)
    found = prompt_file.load_prompts(p).prompts
    return [Prompt(f"{p.name} #{i}", q.messages or (("user", q.text),)) for i, q in enumerate(found, start=1)]
