"""Incremental detokenization and stop strings (pure Python, no model)."""

from llamafleet.engine.text import Detokenizer, StopMatcher


def test_detokenizer_never_splits_a_utf8_character() -> None:
    text = "你好，世界! naïve ☕"
    data = text.encode("utf-8")
    d = Detokenizer()
    pieces = [d.feed(data[i:i + 1]) for i in range(len(data))]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + d.flush() == text
    # the first byte of a 3-byte character alone yields nothing yet
    assert Detokenizer().feed("你".encode()[:1]) == ""


def test_detokenizer_flush_marks_an_incomplete_tail() -> None:
    d = Detokenizer()
    assert d.feed(b"a" + "你".encode()[:2]) == "a"
    assert d.flush() == "\ufffd"


def test_stop_string_is_not_emitted_and_prefix_is_held_back() -> None:
    m = StopMatcher(("\nUser:",))
    assert m.feed("Hello") == ("Hello", False)
    assert m.feed(" world\nUs") == (" world", False)  # "\nUs" could start the stop string
    assert m.feed("er: hi") == ("", True)


def test_held_back_text_is_released_when_it_cannot_match() -> None:
    m = StopMatcher(("STOP",))
    assert m.feed("ST") == ("", False)
    assert m.feed("ART") == ("START", False)
    assert m.feed("ST") == ("", False)
    assert m.flush() == "ST"


def test_earliest_of_several_stop_strings_wins() -> None:
    m = StopMatcher(("world", "lo"))
    assert m.feed("hello world") == ("hel", True)


def test_no_stops_passes_text_through() -> None:
    m = StopMatcher(())
    assert m.feed("abc") == ("abc", False)
    assert m.flush() == ""
