"""The OpenAI wire format as llamafleet's clients read it (a remote member's relay, the benchmark): one parser of
streamed answers, the server's root URL, error bodies."""

from __future__ import annotations

from llamafleet.openai_wire import bearer, error_text, parse_sse_line, root_url


def test_parse_sse_lines() -> None:
    assert parse_sse_line("") is None and parse_sse_line(": keep-alive") is None
    assert parse_sse_line("data: [DONE]") == parse_sse_line("data:[DONE]")
    done = parse_sse_line("data: [DONE]")
    assert done is not None and done.done
    comp = parse_sse_line('data: {"choices": [{"index": 0, "text": " Paris", "finish_reason": null}]}')
    assert comp is not None and comp.text == " Paris" and comp.finish_reason is None
    role = parse_sse_line('data: {"choices": [{"delta": {"role": "assistant"}, "finish_reason": null}]}')
    assert role is not None and role.text == ""
    chat = parse_sse_line('data: {"choices": [{"delta": {"content": "Hi"}, "finish_reason": "length"}]}')
    assert chat is not None and (chat.text, chat.finish_reason) == ("Hi", "length")
    usage = parse_sse_line('data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 8}}')
    assert usage is not None and usage.usage and (usage.prompt_tokens, usage.completion_tokens) == (7, 8)
    assert not chat.usage
    err = parse_sse_line('data: {"error": {"message": "model not found", "type": "invalid_request_error"}}')
    assert err is not None and err.error == "model not found"
    broken = parse_sse_line("data: {not json")
    assert broken is not None and broken.error is not None and "malformed" in broken.error
    scalar = parse_sse_line("data: 3")
    assert scalar is not None and scalar.error is not None and "not an object" in scalar.error


def test_cached_tokens_are_read_from_usage() -> None:
    ev = parse_sse_line('data: {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 4, '
                        '"prompt_tokens_details": {"cached_tokens": 96}}}')
    assert ev is not None and (ev.prompt_tokens, ev.cached_tokens) == (100, 96)
    for usage in ('{"prompt_tokens": 100, "completion_tokens": 4}',
                  '{"prompt_tokens": 100, "completion_tokens": 4, "prompt_tokens_details": null}'):
        ev = parse_sse_line(f'data: {{"choices": [], "usage": {usage}}}')
        assert ev is not None and ev.prompt_tokens == 100 and ev.cached_tokens is None


def test_each_choices_logprobs_are_kept_as_sent() -> None:
    lp = {"content": [{"token": "Hi", "logprob": -0.5, "top_logprobs": []}]}
    ev = parse_sse_line('data: {"choices": [{"delta": {"content": "Hi"}, "logprobs": '
                        '{"content": [{"token": "Hi", "logprob": -0.5, "top_logprobs": []}]}}]}')
    assert ev is not None and ev.logprobs == (lp,)


def test_root_url_bearer_and_error_text() -> None:
    assert root_url("http://h:1/v1/") == root_url("http://h:1/") == root_url("http://h:1") == "http://h:1"
    assert bearer(None) == {} and bearer("k") == {"Authorization": "Bearer k"}
    assert error_text(b'{"error": {"message": "nope"}}') == "nope"
    assert error_text(b'{"error": "plain"}') == "plain"
    assert error_text(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
