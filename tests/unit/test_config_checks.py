"""Config keys that cannot apply are said: a typo gets the nearest valid key, GPU placement keys on a machine
without GPUs and ``threads`` above the core count get a warning (from ``serve`` and ``plan``) naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.cli import main
from llamafleet.config import ConfigError, FleetConfig, load_config
from llamafleet.placement.advice import inapplicable
from llamafleet.placement.gpus import empty_inventory, load_inventory

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = empty_inventory("NVML not available: test")
TWO_GPUS = load_inventory(ROOT / "examples" / "inventories" / "2x24gb-pcie.yaml")


def test_a_typo_gets_the_nearest_key() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, {"paralel": 4})
    assert "unknown key 'paralel': did you mean 'parallel'?" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, {"context_lenght": 2048})
    assert "did you mean 'context_length'?" in str(e.value)


def test_a_key_like_no_other_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, {"zzz": 1})
    assert "unknown key 'zzz': remove it or use one of: " in str(e.value) and "context_length" in str(e.value)


def test_gpu_placement_keys_without_gpus_are_said() -> None:
    cfg = FleetConfig(main_gpu=0, split_ratio=[0.5, 0.5], split_mode="layer")
    lines = inapplicable(cfg, NO_GPU, cores=8)
    assert [line.split()[0] for line in lines] == ["main_gpu", "split_ratio", "split_mode"]
    assert all("no GPU (NVML not available: test)" in line and "remove it" in line for line in lines)
    assert inapplicable(cfg, TWO_GPUS, cores=8) == []
    assert inapplicable(FleetConfig(), NO_GPU, cores=8) == []


def test_threads_above_the_cores_are_said() -> None:
    (line,) = inapplicable(FleetConfig(threads=64), TWO_GPUS, cores=8)
    assert "threads 64" in line and "8 CPU cores" in line and "set threads to 8 or fewer" in line
    assert inapplicable(FleetConfig(threads=8), TWO_GPUS, cores=8) == []
    assert inapplicable(FleetConfig(threads=64), TWO_GPUS, cores=None) == []  # another machine's: not known


def test_plan_prints_the_warnings(model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("main_gpu: 0\nthreads: 100000\n", encoding="utf-8")
    empty = tmp_path / "no-gpu.yaml"
    empty.write_text("gpus: []\n", encoding="utf-8")
    assert main(["plan", "--model", str(model_path), "--config", str(config), "--inventory", str(empty)]) == 0
    err = capsys.readouterr().err
    assert "warning: main_gpu is set but this machine has no GPU" in err
    assert "threads" not in err  # a described inventory is another machine: its cores are not known
    assert main(["plan", "--model", str(model_path), "--config", str(config)]) == 0  # this machine
    assert "warning: threads 100000 is more than this machine's" in capsys.readouterr().err
