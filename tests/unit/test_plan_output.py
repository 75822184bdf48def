"""What ``llamafleet plan`` prints, read as a new user reads it: the model under the name clients send, the reason
for a CPU plan said once, no "others" that do not exist, plain grammar."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.cli import main
from synth_models import sparse_models


@pytest.fixture(scope="module")
def no_gpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inventory") / "cpu-box.yaml"
    path.write_text("gpus: []\nhost_mem_mib: 16000\n", encoding="utf-8")
    return path


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["plan", *argv])
    return rc, capsys.readouterr().out


def test_the_model_is_named_as_clients_name_it_and_the_cpu_reason_is_said_once(
        no_gpu: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    model = Path(sparse_models(tmp_path_factory)["7b-q4_0"].path)
    rc, out = plan(capsys, "--model", str(model), "--inventory", str(no_gpu), "--parallel", "1", "--ctx", "256")
    assert rc == 0
    assert out.splitlines()[1].startswith(f"  {model.stem}: llama, Q4_0")  # the file's stem, not general.name
    assert out.count("lists no GPU") == 1
    rc, out = plan(capsys, "--model", str(model), "--inventory", str(no_gpu), "--parallel", "1", "--ctx", "256",
                   "--config", str(_config(no_gpu.parent, "model_name: chat\n")))
    assert out.splitlines()[1].startswith("  chat: llama") and "  - chat (Q4_0" in out


def test_ram_offers_what_it_offers(no_gpu: Path, tmp_path_factory: pytest.TempPathFactory,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = sparse_models(tmp_path_factory)["70b-q4_0"].path
    rc, out = plan(capsys, "--model", model, "--inventory", str(no_gpu))
    assert rc == 1 and "but RAM offers " in out and "RAM offer " not in out


def test_a_fleet_that_all_fits_has_no_others_that_swap(tmp_path_factory: pytest.TempPathFactory,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    models = sparse_models(tmp_path_factory)
    folder = tmp_path_factory.mktemp("fleet")
    inventory = folder / "big.yaml"
    inventory.write_text("gpus:\n  - {name: big GPU, total_mib: 200000}\n", encoding="utf-8")
    config = _config(folder, "parallel: 1\ncontext_length: 512\nmodels:\n"
                             f"  - {{name: a, path: {models['7b-q4_0'].path}}}\n"
                             f"  - {{name: b, path: {models['13b-q4_0'].path}}}\n")
    rc, out = plan(capsys, "--config", str(config), "--inventory", str(inventory))
    assert rc == 0 and "fleet: FITS (2 model(s); all 2 fit in memory together; pinned" in out
    assert "swap" not in out.split("\n")[2]


def _config(folder: Path, text: str) -> Path:
    path = folder / f"fleet-{abs(hash(text))}.yaml"
    path.write_text(text, encoding="utf-8")
    return path
