"""What a person who mistypes sees: every bad value at once, the nearest flag for a misspelt one, the file and line
of a YAML syntax error, and one exit code per kind of error (documented in docs/OPERATIONS.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llamafleet.cli import main
from llamafleet.config import ConfigError, load_config
from llamafleet.exits import Exit

ROOT = Path(__file__).resolve().parents[2]


def test_every_bad_value_of_the_file_and_the_flags_is_named_at_once(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("parallel: two\nport: 99999\ncontext_lenght: 2048\n", encoding="utf-8")
    assert main(["plan", "--config", str(config), "--replicas", "none", "--ctx", "12x"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert f"invalid configuration in {config} and the command-line flags:" in err
    for named in ("'parallel': ", "'port': ", "unknown key 'context_lenght': did you mean 'context_length'?",
                  "'replicas' (a command-line flag): ", "'context_length' (a command-line flag): "):
        assert named in err, (named, err)
    assert "(got 'two')" in err and "(got 99999)" in err and "(got '12x')" in err


def test_keys_that_cannot_go_together_are_all_named() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, {"rpc_servers": ["10.0.0.2:50052"], "models_dir": "m", "model_name": "x",
                           "batch_size": 64, "ubatch_size": 128})
    lines = str(e.value).splitlines()[1:]
    assert len(lines) == 4, lines  # the opt-in, rpc with several models, ubatch > batch, one model or several
    assert all(line.startswith("  - ") for line in lines)


def test_every_bad_knob_of_a_models_entry_is_named() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, {"models": [{"name": "a", "path": "a.gguf", "paralel": 2, "batch_size": 0,
                                       "parallel": "two"}]})
    text = str(e.value)
    for named in ("'models.0': unknown key 'paralel': did you mean 'parallel'?", "'models.0': 'batch_size': ",
                  "'models.0': 'parallel': "):
        assert named in text, (named, text)


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("parallel: 2\ngpus: [0, 1\nport: 8081\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(config)
    assert re.match(rf"{re.escape(str(config))}, line 3, column \d+: not valid YAML \(", str(e.value)), str(e.value)
    assert "<unicode string>" not in str(e.value)


@pytest.mark.parametrize(("argv", "command", "hint"), [
    (["serve", "--paralel", "2"], "serve", "unrecognized argument --paralel: did you mean --parallel?"),
    (["plan", "--models-dri=x"], "plan", "unrecognized argument --models-dri=x: did you mean --models-dir?"),
    (["bench", "engine", "--treads", "1"], "bench engine", "unrecognized argument --treads: did you mean --threads?"),
    (["serve", "extra"], "serve", "unrecognized argument extra (`llamafleet serve --help` lists what it takes)"),
])
def test_a_misspelt_flag_gets_the_nearest_one_and_the_commands_usage(argv: list[str], command: str, hint: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == Exit.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"usage: llamafleet {command} "), err  # the command's usage, not the top level's
    assert hint in err


def test_each_kind_of_error_has_its_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(tmp_path / "missing.gguf")]) == Exit.MODEL
    assert main(["plan", "--config", str(tmp_path / "missing.yaml")]) == Exit.USAGE
    assert "config file not found" in capsys.readouterr().err


def test_the_exit_codes_are_documented() -> None:
    ops = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    table = ops[ops.index("## Exit codes"):]
    for code in Exit:
        assert re.search(rf"^\| {code.value} \| `{code.name}` \|", table, flags=re.MULTILINE), code
