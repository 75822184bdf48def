"""The table of flags and config keys (``llamafleet.flags``): every command that takes a knob spells it, explains it
and defaults it the same way; flags override a config file only when given; the README shows the same table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llamafleet.cli import build_parser
from llamafleet.commands import consistency as consistency_command
from llamafleet.config import FleetConfig, load_config
from llamafleet.consistency.run import DEFAULT_CONFIGS
from llamafleet.flags import BY_KEY, COMMAND_KEYS, FLAGS, help_text, markdown_table, overrides

ROOT = Path(__file__).resolve().parents[2]


def command_parser(command: str) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` ("serve", "bench engine", ...) in the real CLI parser."""
    parser = build_parser()
    for word in command.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def parse(command: str, *argv: str) -> argparse.Namespace:
    return build_parser().parse_args([*command.split(), *argv])


@pytest.mark.parametrize("command", sorted(COMMAND_KEYS))
def test_every_command_takes_its_knobs_from_the_table(command: str) -> None:
    by_dest = {a.dest: a for a in command_parser(command)._actions if a.help != argparse.SUPPRESS}
    for key in COMMAND_KEYS[command]:
        action = by_dest[key]
        assert action.option_strings == [BY_KEY[key].flag], (command, key)
        assert action.help == help_text(key) and action.default is None, (command, key)
    # and no flag of the command sets a config key the table does not give it
    knobs = {a.dest for a in command_parser(command)._actions} & set(FleetConfig.model_fields)
    assert knobs == set(COMMAND_KEYS[command])


def test_a_flag_given_nowhere_leaves_the_config_default() -> None:
    for command in COMMAND_KEYS:
        cfg = load_config(None, overrides(parse(command)))
        assert cfg == FleetConfig(), command  # e.g. consistency's context was 1024 where serve's was 4096


def test_consistency_and_serve_read_the_same_flags_the_same_way() -> None:
    argv = ("--ctx", "2048", "--batch", "64", "--threads", "2", "--log-level", "debug", "--model", "m.gguf")
    consistency = load_config(None, overrides(parse("consistency", *argv)))
    assert consistency == load_config(None, overrides(parse("serve", *argv)))
    # the older spelling of --batch still works, hidden from --help
    assert overrides(parse("consistency", "--n-batch", "16"))["batch_size"] == 16
    assert overrides(parse("serve", "--n-batch", "16"))["batch_size"] == 16
    assert "--n-batch" not in command_parser("consistency").format_help()
    # serve takes the placement flags that plan takes
    cfg = load_config(None, overrides(parse("serve", "--split-mode", "layer", "--prefer", "latency")))
    assert (cfg.split_mode, cfg.prefer) == ("layer", "latency")


def test_a_config_file_is_overridden_only_by_flags_that_were_given(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("context_length: 2048\nbatch_size: 64\nlog_level: error\n", encoding="utf-8")
    for command in ("consistency", "serve", "plan"):
        cfg = load_config(str(path), overrides(parse(command, "--config", str(path))))
        assert (cfg.context_length, cfg.batch_size) == (2048, 64), command
    cfg = load_config(str(path), overrides(parse("consistency", "--config", str(path), "--ctx", "512")))
    assert (cfg.context_length, cfg.batch_size, cfg.log_level) == (512, 64, "error")


def test_consistency_names_the_same_default_configurations_as_its_runner() -> None:
    assert ",".join(DEFAULT_CONFIGS) == consistency_command.DEFAULT_CONFIGS


def test_every_flag_of_the_table_is_used_and_named_once() -> None:
    assert len({f.flag for f in FLAGS}) == len(FLAGS) and len(BY_KEY) == len(FLAGS)
    used = {k for keys in COMMAND_KEYS.values() for k in keys}
    assert used == set(BY_KEY) and set(BY_KEY) <= set(FleetConfig.model_fields)


def test_readme_shows_the_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme, (
        "README.md's flags table differs from llamafleet.flags; paste the output of "
        "`python -c 'from llamafleet.flags import markdown_table; print(markdown_table())'`")
