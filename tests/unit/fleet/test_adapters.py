"""The adapter set a request asks for (fleet/adapters.py): by the model name MODEL:ADAPTER and by llama-server's lora
list, in one canonical form; scale 0 is no adapter; an unknown id is named."""

from __future__ import annotations

import pytest

from llamafleet.engine.types import LoraSpec
from llamafleet.fleet.adapters import UnknownAdapter, chosen

ADAPTERS = (LoraSpec("a", "a.gguf", 1.0), LoraSpec("style", "s.gguf", 0.5))


def test_by_name_by_id_and_by_position() -> None:
    assert chosen(ADAPTERS, None, None) == ()
    assert chosen(ADAPTERS, "style", None) == (("style", 0.5),)
    assert chosen(ADAPTERS, None, [(1, None)]) == (("style", 0.5),)  # the configured scale
    assert chosen(ADAPTERS, None, [("a", 0.25), (1, 2.0)]) == (("a", 0.25), ("style", 2.0))
    assert chosen(ADAPTERS, "a", [(1, 1.0)]) == (("a", 1.0), ("style", 1.0))  # the name's adapter stays on
    assert chosen(ADAPTERS, None, [(1, 1.0), ("style", 0.3)]) == (("style", 0.3),)  # the last entry wins


def test_scale_zero_is_no_adapter() -> None:
    assert chosen(ADAPTERS, "a", [("a", 0.0)]) == ()
    assert chosen(ADAPTERS, None, [(0, 0.0), (1, -0.0)]) == ()


@pytest.mark.parametrize(("name", "listed", "words"), [
    (None, [(2, 1.0)], "lora[0].id: no adapter 2; this model's adapters are 0: 'a', 1: 'style'"),
    (None, [("a", 1.0), (-1, 1.0)], "lora[1].id: no adapter -1"),
    (None, [("zz", None)], "lora[0].id: no adapter 'zz'"),
    ("gone", None, "no adapter 'gone'; this model's adapters are 0: 'a', 1: 'style'"),
])
def test_unknown_ids_are_named(name: str | None, listed: list[tuple[int | str, float | None]], words: str) -> None:
    with pytest.raises(UnknownAdapter) as e:
        chosen(ADAPTERS, name, listed)
    assert words in str(e.value)
