"""The pure parts of ``/v1/embeddings``: what a request may hold, and how a vector is encoded for the client."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from llamafleet.api.embeddings import MAX_INPUTS, EmbeddingRequest, encode
from llamafleet.api.middleware import scope_of
from llamafleet.api.openai import context_error
from llamafleet.api.openai_requests import split_prompts
from llamafleet.engine.types import ContextOverflow


def parse(**body: Any) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate({"model": "m", **body})


@pytest.mark.parametrize(("given", "inputs"), [
    ("hello", ["hello"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [(1, 2, 3)]),
    ([[1, 2], [3]], [(1, 2), (3,)]),
])
def test_the_four_shapes_of_input(given: Any, inputs: list[Any]) -> None:
    assert split_prompts(parse(input=given).input) == inputs


def test_nulls_are_unset_and_defaults_apply() -> None:
    req = parse(input="x", encoding_format=None, dimensions=None, user=None)
    assert req.encoding_format == "float" and req.dimensions is None


@pytest.mark.parametrize("body", [
    {"input": ""}, {"input": []}, {"input": [""]}, {"input": [[]]}, {"input": ["a", 1]}, {"input": [True]},
    {"input": ["x"] * (MAX_INPUTS + 1)}, {"input": "\ud800"}, {"input": "x", "encoding_format": "int8"},
    {"input": "x", "dimensions": 0}, {"input": "x", "extra": 1}, {},
])
def test_refused_bodies(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse(**body)


def test_base64_is_what_the_openai_sdk_decodes() -> None:
    v = np.array([0.5, -1.25, 3.0e-8, 1.0], dtype="<f4")
    text = encode(v.tobytes(), "base64")
    assert isinstance(text, str)
    assert np.frombuffer(base64.b64decode(text), dtype="float32").tolist() == v.tolist()  # the SDK's own decoding
    assert encode(v.tobytes(), "float") == v.tolist()


def test_an_input_too_long_is_worded_as_openai_words_it() -> None:
    err = context_error(ContextOverflow(512, 700, 0), "input")
    assert err.status == 400 and err.code == "context_length_exceeded" and err.param == "input"
    assert err.message == ("This model's maximum context length is 512 tokens, however you requested 700 tokens "
                           "(700 in your prompt; 0 for the completion). Please reduce your prompt; or completion "
                           "length.")


def test_rerank_routes_need_the_embeddings_scope_as_embeddings_do() -> None:
    assert {scope_of(p) for p in ("/v1/embeddings", "/v1/rerank", "/rerank", "/v1/reranking", "/reranking")} == {
        "embeddings"}
    assert scope_of("/v1/chat/completions") == "inference" and scope_of("/metrics") == "metrics"
