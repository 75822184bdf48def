"""Hub references: the accepted forms, the refused ones, and which of a repo's files each names."""

from __future__ import annotations

import pytest

from llamafleet.model.hub_ref import HubRef, PickError, RefError, is_ref, model_stem, parse_ref, pick_files

REPO = ["README.md", "config.json",
        "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "Llama-3.2-3B-Instruct-Q4_K_S.gguf", "Llama-3.2-3B-Instruct-Q4_K.gguf",
        "Llama-3.2-3B-Instruct-Q8_0.gguf", "Llama-3.2-3B-Instruct-f16.gguf", "mmproj-Llama-3.2-3B-Q8_0.gguf",
        "Q6_K/Llama-3.2-3B-Instruct-Q6_K-00001-of-00002.gguf", "Q6_K/Llama-3.2-3B-Instruct-Q6_K-00002-of-00002.gguf"]


@pytest.mark.parametrize(("text", "ref"), [
    ("hf:bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", HubRef("bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M")),
    ("hf:org/repo", HubRef("org/repo")),
    ("hf:org/repo/sub/model-q8_0.gguf", HubRef("org/repo", file="sub/model-q8_0.gguf")),
    ("hf:org/repo:Q4_0@v1.2", HubRef("org/repo", "Q4_0", revision="v1.2")),
    ("hf:org/repo/m.gguf@refs/pr/3", HubRef("org/repo", file="m.gguf", revision="refs/pr/3")),
    ("hf:org/repo@0123456789abcdef0123456789abcdef01234567",
     HubRef("org/repo", revision="0123456789abcdef0123456789abcdef01234567")),
])
def test_accepted_forms_round_trip(text: str, ref: HubRef) -> None:
    assert is_ref(text)
    assert parse_ref(text) == ref
    assert str(ref) == text


@pytest.mark.parametrize(("text", "why"), [
    ("hf:org", "names no repo"),
    ("hf:org/repo/../../etc/passwd.gguf", "not a plain path"),
    ("hf:org/repo/a/./b.gguf", "not a plain path"),
    ("hf:org/repo//b.gguf", "not a plain path"),
    ("hf:org/repo/README.md", "not a .gguf file"),
    ("hf:org/repo:Q4 K", "not a quant tag"),
    ("hf:org/repo:", "not a quant tag"),
    ("hf:../repo:Q4_0", "not a hub name"),
    ("hf:org/re po", "not a hub name"),
    ("hf:org/repo@../main", "not a branch"),
    ("hf:org/repo@", "not a branch"),
    ("models/x.gguf", "does not start with hf:"),
])
def test_malformed_references_show_the_forms(text: str, why: str) -> None:
    with pytest.raises(RefError) as e:
        parse_ref(text)
    assert why in str(e.value)
    assert "hf:ORG/REPO:QUANT" in str(e.value) and "hf:ORG/REPO/FILE.gguf" in str(e.value)
    assert "@REVISION" in str(e.value)


def test_a_quant_tag_picks_the_file_that_carries_it_whole() -> None:
    ref = parse_ref("hf:org/repo:q4_k_m")
    assert pick_files(ref, REPO) == ["Llama-3.2-3B-Instruct-Q4_K_M.gguf"]
    # Q4_K is a prefix of Q4_K_M and Q4_K_S but names only its own file; Q8_0 skips the multimodal projector
    assert pick_files(parse_ref("hf:org/repo:Q4_K"), REPO) == ["Llama-3.2-3B-Instruct-Q4_K.gguf"]
    assert pick_files(parse_ref("hf:org/repo:Q8_0"), REPO) == ["Llama-3.2-3B-Instruct-Q8_0.gguf"]


def test_a_split_model_is_fetched_whole_first_part_first() -> None:
    parts = ["Q6_K/Llama-3.2-3B-Instruct-Q6_K-00001-of-00002.gguf",
             "Q6_K/Llama-3.2-3B-Instruct-Q6_K-00002-of-00002.gguf"]
    assert pick_files(parse_ref("hf:org/repo:Q6_K"), reversed(REPO)) == parts
    assert pick_files(parse_ref(f"hf:org/repo/{parts[0]}"), REPO) == parts
    with pytest.raises(PickError, match="part 2 of a split model; name its first part"):
        pick_files(parse_ref(f"hf:org/repo/{parts[1]}"), REPO)
    with pytest.raises(PickError, match="lacks its part"):
        pick_files(parse_ref("hf:org/repo:Q6_K"), [parts[0]])


def test_a_tag_matching_no_file_or_several_lists_the_files() -> None:
    with pytest.raises(PickError) as e:
        pick_files(parse_ref("hf:org/repo:IQ2_XS"), REPO)
    assert "no file carries the quant tag IQ2_XS" in str(e.value)
    assert "Llama-3.2-3B-Instruct-Q8_0.gguf" in str(e.value)
    assert "Q6_K/Llama-3.2-3B-Instruct-Q6_K-*-of-00002.gguf" in str(e.value)
    two = ["a-Q4_0.gguf", "b-Q4_0.gguf"]
    with pytest.raises(PickError, match=r"2 files carry the quant tag Q4_0(.|\n)*a-Q4_0.gguf\n  b-Q4_0.gguf"):
        pick_files(parse_ref("hf:org/repo:Q4_0"), two)
    with pytest.raises(PickError, match="holds 5 GGUF models; name one with :QUANT"):
        pick_files(parse_ref("hf:org/repo"), REPO[:8])
    assert pick_files(parse_ref("hf:org/repo"), ["only-Q4_0.gguf", "mmproj-f16.gguf"]) == ["only-Q4_0.gguf"]


def test_a_repo_without_gguf_lists_what_it_has() -> None:
    with pytest.raises(PickError, match=r"holds no \.gguf file .*it holds: README.md, model.safetensors"):
        pick_files(parse_ref("hf:org/repo:Q4_0"), ["model.safetensors", "README.md"])
    with pytest.raises(PickError, match="has no file x.gguf"):
        pick_files(parse_ref("hf:org/repo/x.gguf"), REPO)


def test_a_split_model_is_named_without_its_part_suffix() -> None:
    assert model_stem("Q6_K/Llama-Q6_K-00001-of-00002.gguf") == "Llama-Q6_K"
    assert model_stem("llama-2-7b.Q4_K_M.gguf") == "llama-2-7b.Q4_K_M"
