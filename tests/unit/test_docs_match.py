"""The docs show only what the code has: every `llamafleet COMMAND --flag` written in README.md and docs/*.md is
a flag of that command, every fleet YAML the docs show is a valid configuration, and the metrics the docs name are
the ones the server exports (all of them in docs/OPERATIONS.md)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from llamafleet.cli import build_parser
from llamafleet.config import FleetConfig
from llamafleet.fleet.telemetry import FleetMetrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"llamafleet ((?:[a-z-]+)(?: [^`\n|;&#]*)?)")


def _sub(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def commands_in_docs() -> list[tuple[str, int, str, list[str]]]:
    """(file, line, command words, flags) for every `llamafleet ...` command line written in the docs."""
    found = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in COMMAND.finditer(line):
                try:
                    words = shlex.split(m.group(1).replace("[", " ").replace("]", " "), comments=True)
                except ValueError:  # an unfinished quote: the words up to it
                    words = m.group(1).split()
                found.append((doc.name, n, m.group(1), words))
    return found


def test_every_flag_the_docs_give_a_command_is_one_it_takes() -> None:
    parser, wrong = build_parser(), []
    for doc, n, text, words in commands_in_docs():
        command, sub = parser, _sub(parser)
        assert sub is not None
        if not words or words[0] not in sub.choices:
            if words and re.fullmatch(r"[a-z]+(-[a-z]+)+", words[0]):  # a command's name that does not exist
                wrong.append(f"{doc}:{n}: no command 'llamafleet {words[0]}'")
            continue
        for word in words:  # down the sub-commands named ("bench engine")
            inner = _sub(command)
            if inner is None or word not in inner.choices:
                break
            command = inner.choices[word]
        known = _flags(command)
        for word in words:
            flag = word.split("=", 1)[0]
            if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in known:
                wrong.append(f"{doc}:{n}: `llamafleet {text.strip()}`: {command.prog} takes no {flag}")
    assert not wrong, "\n".join(wrong)


def fleet_yamls() -> list[tuple[str, int, str]]:
    """The ```yaml blocks of the docs that are fleet configurations (not inventories or Kubernetes specs)."""
    blocks = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"```yaml\n(.*?)```", text, flags=re.DOTALL):
            body = m.group(1)
            data = yaml.safe_load(body)
            if isinstance(data, dict) and set(data) & set(FleetConfig.model_fields) and "total_mib" not in body:
                blocks.append((doc.name, text[: m.start()].count("\n") + 1, body))
    return blocks


@pytest.mark.parametrize(("doc", "line", "body"), fleet_yamls(), ids=lambda v: str(v)[:24])
def test_every_fleet_yaml_the_docs_show_is_valid(doc: str, line: int, body: str) -> None:
    FleetConfig.model_validate(yaml.safe_load(body))


def test_the_docs_name_every_metric_and_only_metrics_that_exist() -> None:
    exported = set(re.findall(r"^# TYPE (\S+)", FleetMetrics().registry.render(), flags=re.MULTILINE))
    named = {m for doc in DOCS for m in re.findall(r"\bllamafleet_[a-z_]*[a-z]", doc.read_text(encoding="utf-8"))}
    unknown = [m for m in named if not any(m == e or m.startswith(f"{e}_") or e.startswith(m) for e in exported)]
    assert not unknown, f"the docs name metrics that do not exist: {sorted(unknown)}"
    operations = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    assert not [e for e in exported if f"`{e}`" not in operations], "docs/OPERATIONS.md's metrics table lacks some"
