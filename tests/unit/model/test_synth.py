"""``llamafleet synth``: LLaMA-2 shapes and parameter counts, weight statistics, sparse files, tokenizer, CLI."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from llamafleet.cli import main
from llamafleet.model.header import read_fields, read_header, read_model_info
from llamafleet.model.synth import QUANTS, SHAPES, SynthError, find_vocab, tensor_specs, write_model

# Parameter counts of Meta's LLaMA-2 checkpoints.
LLAMA2_PARAMS = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192}


@pytest.mark.parametrize("shape", sorted(LLAMA2_PARAMS))
def test_shapes_have_llama2_parameter_counts(shape: str) -> None:
    specs = tensor_specs(SHAPES[shape], gguf.GGMLQuantizationType.Q4_0)
    assert sum(math.prod(s.ne) for s in specs) == LLAMA2_PARAMS[shape]
    assert len(specs) == 9 * SHAPES[shape].n_layer + 3


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dense")
    return {q: write_model(folder / f"tiny-{q}.gguf", SHAPES["tiny"], q, find_vocab(), progress=False) for q in QUANTS}


@pytest.mark.parametrize("quant", sorted(QUANTS))
def test_weights_are_finite_with_the_intended_spread(dense: dict[str, Path], quant: str) -> None:
    _, tensors = read_header(dense[quant])  # checked against gguf.GGUFReader in test_gguf_info.py
    data = np.memmap(dense[quant], dtype=np.uint8, mode="r")
    seen = set()
    for t in tensors:
        rows = math.prod(t.shape[1:])
        w = dequantize(np.asarray(data[t.offset : t.offset + t.n_bytes]).reshape(rows, -1),
                       gguf.GGMLQuantizationType[t.ggml_type])
        assert np.isfinite(w).all(), t.name
        if t.name.endswith("norm.weight"):
            assert (w == 1.0).all(), t.name
            continue
        seen.add(t.ggml_type)
        n_in = t.shape[0]
        assert np.std(w) == pytest.approx(0.5 / math.sqrt(n_in), rel=0.05), t.name
        assert abs(float(np.mean(w))) < 0.15 * np.std(w), t.name
    assert seen == {QUANTS[quant][0].name}


def test_same_seed_same_bytes_other_seed_other_bytes(dense: dict[str, Path], tmp_path: Path) -> None:
    again = write_model(tmp_path / "a.gguf", SHAPES["tiny"], "q4_0", find_vocab(), progress=False)
    other = write_model(tmp_path / "b.gguf", SHAPES["tiny"], "q4_0", find_vocab(), seed=7, progress=False)
    assert again.read_bytes() == dense["q4_0"].read_bytes()
    assert other.read_bytes() != again.read_bytes() and other.stat().st_size == again.stat().st_size


def test_header_carries_shape_and_the_llama2_tokenizer(dense: dict[str, Path]) -> None:
    vocab = read_fields(find_vocab(), "tokenizer.")
    fields = read_fields(dense["q8_0"], "")
    for key, field in vocab.items():
        assert fields[key].value == field.value, key
    assert len(fields["tokenizer.ggml.tokens"].value) == 32000  # type: ignore[arg-type]
    assert "[INST]" in str(fields["tokenizer.chat_template"].value)
    assert fields["general.file_type"].value == gguf.LlamaFileType.MOSTLY_Q8_0
    assert fields["llama.attention.head_count_kv"].value == 2
    assert fields["llama.rope.dimension_count"].value == 64


def test_sparse_file_is_a_hole_with_the_full_size(tmp_path: Path) -> None:
    path = write_model(tmp_path / "7b.gguf", SHAPES["llama2-7b"], "f16", find_vocab(), sparse=True, progress=False)
    info = read_model_info(path)
    st = path.stat()
    assert st.st_size >= info.weights_bytes > 12 * 2**30
    assert st.st_blocks * 512 < 16 * 2**20  # only the header takes disk space
    assert info.file_type == "F16" and info.n_params == LLAMA2_PARAMS["llama2-7b"]


def test_unknown_quant_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(SynthError, match="unknown quant 'q2_k'"):
        write_model(tmp_path / "x.gguf", SHAPES["tiny"], "q2_k", find_vocab())
    assert list(tmp_path.iterdir()) == []


def test_vocab_lookup_errors_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SynthError, match="--vocab .*no such file"):
        find_vocab(tmp_path / "missing.gguf")
    monkeypatch.setenv("LLAMAFLEET_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SynthError, match=r"taken from .*llama_cpp_python-0\.3\.36\.tar\.gz.*\(or give --vocab PATH"):
        find_vocab(fetch=False)


def test_vocab_is_extracted_from_the_sdist_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llamafleet.paths import llama_cpp_sdist_dir

    sdist = llama_cpp_sdist_dir()  # the real cache, before pointing the cache elsewhere
    if not any(sdist.glob("llama_cpp_python-*.tar.gz")):
        pytest.skip("the llama-cpp-python sdist is not in the cache (scripts/install.sh keeps it there)")
    cache = tmp_path / "cache"
    (cache / "sdist").mkdir(parents=True)
    for f in sdist.glob("llama_cpp_python-*.tar.gz"):
        (cache / "sdist" / f.name).symlink_to(f)
    monkeypatch.setenv("LLAMAFLEET_CACHE", str(cache))
    vocab = find_vocab(fetch=False)
    assert vocab == cache / "vendor" / "models" / "ggml-vocab-llama-spm.gguf"
    assert len(read_fields(vocab, "tokenizer.ggml.tokens")["tokenizer.ggml.tokens"].value) == 32000  # type: ignore[arg-type]


def test_a_real_tokenizer_and_template_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "qwen3.gguf"
    assert main(["synth", "--shape", "micro", "--quant", "q8_0", "--sparse", "-q", "-o", str(out), "--vocab", "qwen2",
                 "--chat-template", "Qwen-Qwen3-0.6B"]) == 0
    fields = read_fields(out, "tokenizer.")
    assert fields["tokenizer.ggml.pre"].value == "qwen2"
    assert len(fields["tokenizer.ggml.tokens"].value) == read_model_info(out).n_vocab == 151936  # type: ignore[arg-type]
    assert "<tool_call>" in str(fields["tokenizer.chat_template"].value)
    assert main(["synth", "--shape", "micro", "-o", str(out), "--chat-template", "no-such-template"]) == 1
    assert "no models/templates/no-such-template.jinja" in capsys.readouterr().err


def test_cli_writes_a_sparse_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.gguf"
    assert main(["synth", "--shape", "llama2-13b", "--quant", "q8_0", "--sparse", "-q", "-o", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    info = read_model_info(out)
    assert (info.n_layer, info.file_type, info.n_params) == (40, "Q8_0", LLAMA2_PARAMS["llama2-13b"])
    assert info.n_ctx_train == 4096


def test_llama3_8b_has_meta_s_shape_and_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = tensor_specs(SHAPES["llama3-8b"], gguf.GGMLQuantizationType.Q4_0)
    assert sum(math.prod(s.ne) for s in specs) == 8_030_261_248  # Meta-Llama-3-8B's parameter count
    out = tmp_path / "l3.gguf"
    assert main(["synth", "--shape", "llama3-8b", "--ctx-train", "32768", "--sparse", "-q", "-o", str(out)]) == 0
    info = read_model_info(out)
    assert (info.n_layer, info.n_head, info.n_head_kv, info.n_vocab, info.n_ctx_train) == (32, 32, 8, 128256, 32768)
    assert info.n_params == 8_030_261_248
    assert info.kv_elements_per_token * 2 == 128 << 10  # f16 KV: 128 KiB a token, 1 GiB for an 8k session
    fields = read_fields(out, "")
    assert fields["llama.rope.freq_base"].value == 500000.0
    assert fields["llama.feed_forward_length"].value == 14336
    assert fields["tokenizer.ggml.pre"].value == "llama-bpe"  # the shape's own tokenizer and template by default
    assert "<|start_header_id|>" in str(fields["tokenizer.chat_template"].value)


def test_cli_ctx_train_sets_the_trained_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "long.gguf"
    assert main(["synth", "--shape", "tiny", "--ctx-train", "32768", "--sparse", "-q", "-o", str(out)]) == 0
    assert read_model_info(out).n_ctx_train == 32768
    assert read_fields(out, "llama.")["llama.context_length"].value == 32768
    assert main(["synth", "--shape", "tiny", "--ctx-train", "0", "-q", "-o", str(tmp_path / "zero.gguf")]) == 1
    assert "--ctx-train 0" in capsys.readouterr().err and not (tmp_path / "zero.gguf").exists()


def test_cli_writes_bert_encoders_and_a_reranker_the_header_knows(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    for pooling in ("mean", "rank"):
        out = tmp_path / f"{pooling}.gguf"
        assert main(["synth", "--bert", pooling, "-o", str(out)]) == 0
        info = read_model_info(out)
        assert info.architecture == "bert" and info.reranker == (pooling == "rank")
        assert ("cls.output.weight" in {t.name for t in read_header(out)[1]}) == (pooling == "rank")
    assert "reranker" in capsys.readouterr().out
    assert main(["synth", "-o", str(tmp_path / "none.gguf")]) == 2  # neither --shape nor --bert
