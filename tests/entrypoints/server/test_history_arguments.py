"""chat_utils.conversation (LLM.chat's and the server's template input): an assistant's tool
calls reach the chat template with their arguments as an object, as vLLM's
_postprocess_messages makes them, so `arguments|items` templates (Qwen3-Coder) work and
`arguments|tojson` ones (Llama 3.1, Hermes) do not encode them twice."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from compiled_llm.entrypoints.chat_utils import conversation, render
from tests.utils import tokenizer_dir

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}
HISTORY = [{"role": "user", "content": "weather?"},
           {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
TOJSON = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }} "
          "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}")
ITEMS = ("{% for m in messages %}{% for c in m.tool_calls or [] %}<function={{ c.function.name }}>"
         "{% for k, v in c.function.arguments | items %}<{{ k }}={{ v }}>{% endfor %}"
         "{% endfor %}{% endfor %}")


def _with_arguments(arguments) -> list[dict]:
    call = {**CALL, "function": {**CALL["function"], "arguments": arguments}}
    return [HISTORY[0], {**HISTORY[1], "tool_calls": [call]}]


def test_arguments_become_an_object_and_the_input_is_left_alone():
    history = copy.deepcopy(HISTORY)
    convo = conversation(history)
    assert convo[1]["tool_calls"] == [{**CALL, "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]
    assert history == HISTORY
    assert convo[2] == {**HISTORY[2]}


@pytest.mark.parametrize("arguments", ["", None, {}])
def test_absent_arguments_are_an_empty_object(arguments):
    assert conversation(_with_arguments(arguments))[1]["tool_calls"][0]["function"][
        "arguments"] == {}


def test_templates_read_the_arguments_as_an_object():
    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    convo = conversation(HISTORY)
    text = render(tok, convo, chat_template=TOJSON, add_generation_prompt=False)
    assert text == 'get_weather {"city": "Paris", "days": 2}'
    text = render(tok, convo, chat_template=ITEMS, add_generation_prompt=False)
    assert text == "<function=get_weather><city=Paris><days=2>"


@pytest.mark.parametrize(("history", "field"), [
    (_with_arguments("{not json"), r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"),
    ([HISTORY[0], {**HISTORY[1], "tool_calls": [{"id": "x"}]}],
     r"messages\[1\]\.tool_calls\[0\] must be"),
    ([HISTORY[0], {**HISTORY[1], "tool_calls": "call"}], r"messages\[1\]\.tool_calls must"),
])
def test_malformed_calls_are_a_value_error_naming_the_field(history, field):
    with pytest.raises(ValueError, match=field):
        conversation(history)
