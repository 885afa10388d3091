"""Fields the OpenAI API or vLLM define but this server does not honour: each one set is a
400 naming it (never silently dropped), its neutral value is accepted, content parts other
than text are refused by position, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from compiled_llm.entrypoints.server.unsupported import _BOTH, _CHAT
from tests.entrypoints.server.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "The quick"}]
# a value that asks for something, per field
ASKING = {"use_beam_search": True, "length_penalty": 0.5, "early_stopping": True,
          "logits_processors": ["mod.Proc"], "prompt_embeds": "AAAA",
          "guided_whitespace_pattern": " ?", "guided_decoding_backend": "outlines",
          "mm_processor_kwargs": {"fps": 1}, "kv_transfer_params": {"do_remote_decode": True},
          "vllm_xargs": {"k": 1}, "audio": {"voice": "alloy", "format": "wav"},
          "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
          "web_search_options": {}, "store": True, "verbosity": "low",
          "functions": [{"name": "f", "parameters": {}}], "function_call": "auto",
          "ec_transfer_params": {"x": 1}, "logprob_token_ids": [1, 2],
          "repetition_detection": {"max_pattern_size": 4}, "stream_interval": 4,
          "watermarking": True, "truncation_side": "right", "media_io_kwargs": {"image": {}},
          "return_prompt_text": True}


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": server.model, "max_tokens": 1,
                                                   **body}, headers=AUTH, timeout=60)


HONOURED = ("priority", "cache_salt", "return_token_ids", "return_tokens_as_token_ids",
            "spaces_between_special_tokens",
            "add_special_tokens")  # once refused: test_vllm_request_fields.py


def test_honoured_vllm_fields_are_no_longer_refused():
    assert not set(HONOURED) & {*_BOTH, *_CHAT}


@pytest.mark.parametrize("field", sorted({**_BOTH, **_CHAT}))
def test_each_unsupported_field_is_refused_by_name(server, field):
    paths = ["/v1/chat/completions"] + (["/v1/completions"] if field in _BOTH else [])
    for path in paths:
        prompt = {"messages": MESSAGES} if "chat" in path else {"prompt": "The quick"}
        r = _post(server, path, {**prompt, field: ASKING[field]})
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]


def test_neutral_values_and_unknown_fields_are_accepted(server):
    neutral = {name: values[-1] for name, (values, _) in _BOTH.items()}
    chat_neutral = {**neutral, **{name: values[-1] for name, (values, _) in _CHAT.items()}}
    r = _post(server, "/v1/completions", {"prompt": "The quick", **neutral, "x_extra": 1})
    assert r.status_code == 200, r.text
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, **chat_neutral})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("part, param", [
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
     "messages[0].content[1]"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
     "messages[0].content[1]"),
    ({"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
     "messages[0].content[1]"),
    ({"type": "text"}, "messages[0].content[1].text"),
])
def test_non_text_content_parts_are_refused(server, part, param):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look:"}, part]}]
    for path in ("/v1/chat/completions", "/tokenize"):
        r = _post(server, path, {"messages": messages})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = _post(server, "/v1/chat/completions",
               {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]})
    assert ok.status_code == 200
