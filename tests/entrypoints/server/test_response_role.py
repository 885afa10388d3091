"""--response-role: the role of a chat reply after a generation prompt, as vLLM's flag."""

from __future__ import annotations

from compiled_llm.entrypoints.cli.main import build_parser
from compiled_llm.entrypoints.server.protocol import ChatCompletionRequest
from compiled_llm.entrypoints.server.serving_chat import echoed, reply_role


def _request(**extra) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                 **extra)


def test_response_role_after_a_generation_prompt_else_the_last_messages():
    assert reply_role(_request(), "bot") == "bot"
    assert reply_role(_request(add_generation_prompt=False), "bot") == "user"
    # echo repeats the last message only when the reply takes its role
    assert echoed(_request(echo=True), reply_role(_request(), "bot")) == ""
    no_prompt = _request(echo=True, add_generation_prompt=False)
    assert echoed(no_prompt, reply_role(no_prompt, "bot")) == "hi"


def test_serve_takes_the_flag_with_vllms_spelling_and_default():
    parser = build_parser()
    assert parser.parse_args(["serve"]).response_role == "assistant"
    assert parser.parse_args(["serve", "--response-role", "bot"]).response_role == "bot"
