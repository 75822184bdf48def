"""The README's several-models example runs as is: its commands, word for word, make the folder; the server it
starts serves both models to the OpenAI SDK. The example configs that are templates say so, and validate."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import FleetServer
from llamafleet.config import load_config

ROOT = Path(__file__).resolve().parents[2]
LLAMAFLEET = ".venv/bin/llamafleet"


def several_models_block() -> list[str]:
    """The README's runnable several-models commands (the bash block with `--models-dir`)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL)
    (block,) = [b for b in blocks if "serve --models-dir" in b]
    return [line.split(" # ")[0].rstrip() for line in block.splitlines()]


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """The folder the README's commands make, with this interpreter's llamafleet; the serve line is left out."""
    lines = several_models_block()
    assert lines[-1] == f'{LLAMAFLEET} serve --models-dir "$models"'
    cli = f"{sys.executable} -m llamafleet.cli"
    script = "\n".join(["set -euo pipefail", *(line.replace(LLAMAFLEET, cli) for line in lines[:-1]),
                        'echo "$models"'])
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    path = Path(done.stdout.splitlines()[-1])
    yield path
    shutil.rmtree(path)


def test_the_readme_fleet_plans_and_serves_both_models(folder: Path,
                                                       launch_fleet: Callable[[list[str]], FleetServer]) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["SmolLM2-135M-Instruct.Q4_1.gguf", "tiny.gguf"]
    plan = subprocess.run([sys.executable, "-m", "llamafleet.cli", "plan", "--models-dir", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0 and "fleet: FITS (2 model(s); all 2 fit in memory together" in plan.stdout, plan
    server = launch_fleet(["--models-dir", str(folder), "--parallel", "2", "--ctx", "512", "--threads", "1"])
    server.wait_ready()
    client = server.client()
    assert sorted(m.id for m in client.models.list()) == ["SmolLM2-135M-Instruct.Q4_1", "tiny"]
    for name in ("tiny", "SmolLM2-135M-Instruct.Q4_1"):
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hello!"}],
                                               max_tokens=4, temperature=0)
        assert reply.model == name and reply.usage is not None and reply.usage.completion_tokens > 0
    # stopped, each model's replica 0 says its own goodbye, by name, once
    assert server.stop(signal.SIGINT) == 0
    log = server.log()
    for name in ("tiny", "SmolLM2-135M-Instruct.Q4_1"):
        assert log.count(f"replica 0 of {name} llamafleet.fleet.worker: context and model freed; exiting") == 1, log


@pytest.mark.parametrize("name", ["fleet.yaml", "models.yaml"])
def test_the_other_examples_are_marked_templates_and_validate(name: str) -> None:
    path = ROOT / "examples" / name
    assert path.read_text(encoding="utf-8").startswith("# TEMPLATE: ")
    load_config(path)  # every key valid: only the files are placeholders
