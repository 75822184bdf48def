"""A fleet of several models in the configuration (config.py's ``models:``, ``models_dir``; catalog.py): each entry
checked like the top level, per-model knobs on top of the fleet's, the single-model keys unchanged; and
``llamafleet plan`` printing the whole placement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamafleet.catalog import served_models
from llamafleet.cli import main
from llamafleet.config import ConfigError, FleetConfig, load_config
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import load_inventory
from llamafleet.placement.planner import make_plan
from synth_models import sparse_models

ROOT = Path(__file__).resolve().parents[2]
DEMO = Path("demo.gguf")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


def refused(data: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, data)
    return str(e.value)


def test_entries_get_the_same_checks_as_the_top_level() -> None:
    assert "'models.0': unknown key 'paralel': did you mean 'parallel'?" in refused(
        {"models": [{"name": "a", "path": "a.gguf", "paralel": 2}]})
    text = refused({"models": [{"name": "a", "path": "a.gguf", "port": 9}]})  # a fleet key, not a model's
    assert "unknown key 'port': remove it or use one of: " in text and "context_length" in text
    assert "'models.0': 'parallel': Input should be greater than or equal to 1" in refused(
        {"models": [{"name": "a", "path": "a.gguf", "parallel": 0}]})
    assert "'models.0': model 'a' needs a path (its GGUF file) or remote" in refused({"models": [{"name": "a"}]})
    assert "'models.0.replicas': replicas must be 1 or more, or auto" in refused(
        {"models": [{"name": "a", "path": "a.gguf", "replicas": 0}]})
    assert "'models.0': ubatch_size (128) cannot exceed batch_size (64)" in refused(
        {"models": [{"name": "a", "path": "a", "batch_size": 64, "ubatch_size": 128}]})
    assert "'a' names both 'a' and 'b'" in refused(
        {"models": [{"name": "a", "path": "a"}, {"name": "b", "path": "b", "aliases": ["a"]}]})
    assert "model_path names one model, models several" in refused(
        {"models": [{"name": "a", "path": "a"}], "model_path": "x.gguf"})
    assert "model_path names one model, models_dir several" in refused({"models_dir": ".", "model_path": "x"})


def test_single_model_keys_are_unchanged() -> None:
    cfg = load_config(ROOT / "examples" / "fleet.yaml")
    (m,) = served_models(cfg, lambda: DEMO)
    assert m.cfg is cfg and m.pinned and m.name == "llama-2-13b-chat.Q8_0" and m.aliases == ()
    (demo,) = served_models(load_config(None, {"model_name": "x"}), lambda: DEMO)
    assert (demo.name, demo.path) == ("x", DEMO)


def test_entry_knobs_override_the_fleet_and_unset_stays_unset() -> None:
    cfg = load_config(None, {"parallel": 2, "batch_size": 256, "idle_ttl_s": 60, "replicas": 3, "models": [
        {"name": "a", "path": "a.gguf", "context_length": 2048, "pinned": True},
        {"name": "b", "path": "b.gguf", "parallel": 4, "replicas": 2, "idle_ttl_s": 5, "aliases": ["bee"]}]})
    a, b = served_models(cfg, lambda: DEMO)
    assert (a.cfg.parallel, a.cfg.context_length, a.cfg.batch_size, a.cfg.replicas) == (2, 2048, 256, 1)
    assert a.pinned and a.idle_ttl_s == 60 and a.cfg.model_path == "a.gguf" and a.cfg.model_name == "a"
    assert (b.cfg.parallel, b.cfg.replicas, b.idle_ttl_s, b.names, b.pinned) == (4, 2, 5, ("b", "bee"), False)
    assert "context_length" not in b.cfg.model_fields_set  # still fitted by the planner
    (lone,) = served_models(load_config(None, {"models": [{"name": "a", "path": "a.gguf"}]}), lambda: DEMO)
    assert lone.pinned and lone.cfg.replicas is None  # a lone model: the plan's replicas, loaded at start


def test_the_example_fleet_loads() -> None:
    chat, coder, small = served_models(load_config(ROOT / "examples" / "models.yaml"), lambda: DEMO)
    assert chat.pinned and chat.aliases == ("gpt-4o-mini",) and chat.idle_ttl_s == 900 and chat.cfg.parallel == 4
    assert coder.cfg.context_length == 8192 and "context_length" not in chat.cfg.model_fields_set
    assert (small.cfg.parallel, small.idle_ttl_s, small.cfg.replicas) == (16, 120, 1)


def test_models_dir_serves_every_gguf_by_its_stem(tmp_path: Path) -> None:
    for name in ("b.gguf", "a.gguf", "notes.txt", "c-00001-of-00002.gguf", "c-00002-of-00002.gguf"):
        (tmp_path / name).write_bytes(b"")
    served = served_models(load_config(None, {"models_dir": str(tmp_path)}), lambda: DEMO)
    assert [(m.name, m.path.name, m.pinned, m.cfg.replicas) for m in served] == [  # a split model: its first part
        ("a", "a.gguf", False, 1), ("b", "b.gguf", False, 1), ("c", "c-00001-of-00002.gguf", False, 1)]
    for part in ("c-00001-of-00002.gguf", "c-00002-of-00002.gguf"):
        (tmp_path / part).unlink()
    cfg = load_config(None, {"models_dir": str(tmp_path), "models": [
        {"name": "first", "path": str(tmp_path / "b.gguf"), "pinned": True}]})
    assert [m.name for m in served_models(cfg, lambda: DEMO)] == ["first", "a"]  # the list names b already
    with pytest.raises(ConfigError, match="is not a folder"):
        served_models(load_config(None, {"models_dir": str(tmp_path / "nope")}), lambda: DEMO)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no .gguf file"):
        served_models(load_config(None, {"models_dir": str(tmp_path / "empty")}), lambda: DEMO)
    with pytest.raises(ConfigError, match="invalid settings for model 'a'"):  # its knob against the fleet's
        served_models(load_config(None, {"ubatch_size": 128, "models": [{"name": "a", "path": "a",
                                                                         "batch_size": 64}]}), lambda: DEMO)


def test_plan_prints_the_fleet(models: dict[str, ModelInfo], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("parallel: 1\nmodels:\n"
                      f"  - {{name: chat, path: {models['13b-q8_0'].path}, pinned: true, aliases: [gpt-4]}}\n"
                      f"  - {{name: coder, path: {models['7b-f16'].path}}}\n"
                      f"  - {{name: wide, path: {models['7b-q4_0'].path}, parallel: 6}}\n", encoding="utf-8")
    inv = str(ROOT / "examples" / "inventories" / "2x24gb-pcie.yaml")
    assert main(["plan", "--config", str(config), "--inventory", inv]) == 0
    text = capsys.readouterr().out
    assert "fleet: FITS (3 model(s); 2 fit in memory together" in text
    assert "  - wide: evicts coder" in text
    assert any(line.split()[:3] == ["GPU", "0", "24100"] and "17373" in line for line in text.splitlines())
    assert main(["plan", "--config", str(config), "--inventory", inv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    states = {m["name"]: (m["state"], m["evicts"]) for m in d["models"]}
    assert states == {"chat": ("resident", []), "coder": ("resident", []), "wide": ("swapped", ["coder"])}
    assert d["models"][0]["usage_mib"] == {"GPU 0": 17373} and d["devices"][0]["models"] == {"chat": 17373}
    # a model that never fits beside the pinned one: exit 1, with the planner's reasons
    config.write_text("models:\n"
                      f"  - {{name: chat, path: {models['13b-q8_0'].path}, pinned: true, parallel: 1}}\n"
                      f"  - {{name: big, path: {models['70b-q4_0'].path}}}\n", encoding="utf-8")
    assert main(["plan", "--config", str(config), "--inventory", inv]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "big does not fit this machine beside the pinned models (chat)" in out
    assert main(["plan", "--models-dir", str(tmp_path / "none"), "--inventory", inv]) == 2
    assert "models_dir" in capsys.readouterr().err


def test_a_lone_model_in_a_list_plans_like_the_single_model_keys(models: dict[str, ModelInfo]) -> None:
    path = models["7b-q4_0"].path
    (lone,) = served_models(load_config(None, {"models": [{"name": "a", "path": path}]}), lambda: DEMO)
    single = load_config(None, {"model_path": path, "model_name": "a"})  # the plan names it as clients do
    inv = load_inventory(ROOT / "examples" / "inventories" / "2x24gb-pcie.yaml")
    assert make_plan(models["7b-q4_0"], inv, lone.cfg) == make_plan(models["7b-q4_0"], inv, single)


def test_a_malformed_hub_reference_names_its_key() -> None:
    cfg = FleetConfig.model_validate({"models": [{"name": "a", "path": "hf:org/repo/../x.gguf"}]})
    with pytest.raises(ConfigError, match=r"models\[a\]\.path: 'hf:org/repo/\.\./x\.gguf': the file path"):
        served_models(cfg, lambda: Path("demo.gguf"))
    with pytest.raises(ConfigError, match=r"model_path \(--model\): .*names no repo(.|\n)*hf:ORG/REPO:QUANT"):
        served_models(FleetConfig.model_validate({"model_path": "hf:org"}), lambda: Path("demo.gguf"))
