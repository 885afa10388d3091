"""The server's requests take the model's generation-config defaults for the sampling fields
they leave unset (vLLM's generation_config="auto"); max_new_tokens is the default budget where
a request has none (completions keep OpenAI's 16), and a cap when override_generation_config
sets it."""

from __future__ import annotations

from tests.engine.test_generation_defaults import with_generation_config
from tests.entrypoints.server.inprocess import engine_args, serving

PROMPT = [3, 14, 15, 92, 65]


def completion(server, **body) -> tuple[str, int]:
    """(text, completion tokens) of one completion of PROMPT."""
    reply = server.post("/v1/completions", {"prompt": PROMPT, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"], reply.json()["usage"]["completion_tokens"]


def test_unset_fields_follow_the_generation_config(tmp_path):
    model = with_generation_config(tmp_path, {"temperature": 0.9, "top_k": 1,
                                              "max_new_tokens": 5})
    with serving(engine_args(model=str(model))) as server:
        text, _ = completion(server, max_tokens=5)  # top_k 1 from the config: greedy
        greedy, _ = completion(server, temperature=0.0, max_tokens=5)
        assert text == greedy
        chat = server.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True})
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] == 5  # max_new_tokens: the default
        _, used = completion(server, max_tokens=8)  # auto: a default, not a cap
        assert used == 8
        assert server.idle()


def test_override_max_new_tokens_caps_every_request(tmp_path):
    model = with_generation_config(tmp_path, {"top_k": 1})
    args = engine_args(model=str(model), override_generation_config={"max_new_tokens": 3})
    with serving(args) as server:
        _, used = completion(server, max_tokens=8)
        assert used == 3
        chat = server.post("/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] <= 3
