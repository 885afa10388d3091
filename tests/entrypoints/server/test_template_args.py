"""The chat template call as vLLM makes it: chat_template_kwargs override the request's
add_generation_prompt, continue_final_message and tools (vLLM updates the call with them);
`documents` (the field or a kwarg) reach RAG templates; the call's own arguments (tokenize,
return_dict ...) stay refused by name; top_logprobs 0 without logprobs asks for nothing."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from compiled_llm.entrypoints.chat_utils import render
from tests.entrypoints.server.conftest import API_KEY
from tests.utils import tokenizer_dir

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "The quick"}]
DOCS_TEMPLATE = ("{% for d in documents or [] %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
                 "{% for m in messages %}{{ m.content }}{% endfor %}")


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": server.model, **body},
                      headers=AUTH, timeout=60)


def _tokens(server, **body) -> list[int]:
    r = _post(server, "/tokenize", {"messages": MESSAGES, **body})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_template_kwargs_override_the_call_arguments(server):
    plain = _tokens(server, add_generation_prompt=False)
    assert _tokens(server, chat_template_kwargs={"add_generation_prompt": False}) == plain
    assert _tokens(server) != plain
    r = _post(server, "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 1,
        "chat_template_kwargs": {"add_generation_prompt": False}})
    assert r.status_code == 200, r.text


def test_documents_are_accepted_and_top_logprobs_zero_needs_no_logprobs(server):
    for body in ({"documents": [{"title": "a", "text": "b"}]}, {"top_logprobs": 0},
                 {"top_logprobs": 0, "logprobs": False}):
        r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                                   **body})
        assert r.status_code == 200, (body, r.text)
    r = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                               "top_logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_documents_reach_the_template_and_call_arguments_stay_refused():
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    docs = [{"title": "fox", "text": "quick"}]
    text = render(tok, MESSAGES, chat_template=DOCS_TEMPLATE, template_kwargs={"documents": docs})
    assert text == "[fox: quick]The quick"
    with pytest.raises(ValueError, match="documents must be a list"):
        render(tok, MESSAGES, chat_template=DOCS_TEMPLATE, template_kwargs={"documents": "x"})
    with pytest.raises(ValueError, match="chat_template_kwargs.tokenize: an argument"):
        render(tok, MESSAGES, chat_template=DOCS_TEMPLATE, template_kwargs={"tokenize": True})
