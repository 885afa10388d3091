"""The reasoning parsers on DeepSeek-R1 and Qwen3 replies, whole and streamed (tags split
across deltas), and the prompt's state read from the tag tokens; plus the reply streamer
that puts reasoning before content and tool calls."""

from __future__ import annotations

import pytest

from compiled_llm.entrypoints.reasoning_parsers import get_reasoning_parser
from compiled_llm.entrypoints.server.reply import ReplyFormat
from compiled_llm.entrypoints.server.tool_calls import ToolPlan
from compiled_llm.entrypoints.tool_parsers import get_tool_parser
from tests.entrypoints.server.tool_model import tool_checkpoint

# (parser, prompt state, reply, reasoning, content)
CASES = [
    ("qwen3", "none", "<think>\nThe user wants 2+2.\n</think>\n\n4", "\nThe user wants 2+2.\n",
     "\n\n4"),
    ("qwen3", "none", "4, no thinking.", None, "4, no thinking."),
    ("qwen3", "open", "Adding.\n</think>\n\n4", "Adding.\n", "\n\n4"),
    ("qwen3", "closed", "4", None, "4"),
    ("qwen3", "open", "still thinking, cut off", "still thinking, cut off", ""),
    ("deepseek_r1", "none", "Okay, 2+2 is 4.\n</think>\n\nThe answer is 4.",
     "Okay, 2+2 is 4.\n", "\n\nThe answer is 4."),
    ("deepseek_r1", "none", "<think>Okay.</think>4", "Okay.", "4"),
    ("deepseek_r1", "closed", "The answer is 4.", None, "The answer is 4."),
]


@pytest.mark.parametrize(("name", "state", "reply", "reasoning", "content"), CASES)
def test_whole_reply(name, state, reply, reasoning, content):
    assert get_reasoning_parser(name)(state).split(reply, True) == (reasoning, content)


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize(("name", "state", "reply", "reasoning", "content"), CASES)
def test_streamed_reply(name, state, reply, reasoning, content, size):
    """Reasoning deltas all come before content deltas and add up to the whole split."""
    streamer = ReplyFormat(ToolPlan(), get_reasoning_parser(name)(state)).streamer()
    got = {"reasoning_content": "", "content": ""}
    order = []
    pieces = [reply[i:i + size] for i in range(0, len(reply), size)]
    for i, piece in enumerate(pieces):
        delta = streamer.feed(piece, i == len(pieces) - 1)
        assert delta.get("reasoning") == delta.get("reasoning_content")
        for key in ("reasoning_content", "content"):
            if key in delta:
                got[key] += delta[key]
                order.append(key)
    assert got == {"reasoning_content": reasoning or "", "content": content}
    assert order == sorted(order, key=lambda key: key == "content")


def test_reasoning_then_tool_call():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    plan = ToolPlan("auto", tools, parser=get_tool_parser("hermes")(tools))
    reply = ReplyFormat(plan, get_reasoning_parser("qwen3")("open"))
    text = 'Call f.</think>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    message, finish = reply.message(text, "stop")
    assert finish == "tool_calls" and message["reasoning_content"] == "Call f."
    assert message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


PAST = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>a</think>b<|im_end|>\n"
NOW = "<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(("prompt", "state"), [("a<think>b", "open"),
                                               ("<think>a</think>b", "closed"),
                                               ("ab", "none"), ("</think><think>", "open"),
                                               (PAST + NOW, "none"),
                                               (PAST + NOW + "<think>\n", "open"),
                                               (PAST + NOW + "<think>\n\n</think>\n\n",
                                                "closed")])
def test_prompt_state(prompt, state):
    """The last tag token of the current turn decides (the tags and turn markers are single
    tokens here): an earlier assistant turn's closed span leaves this reply free to think."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tool_checkpoint())
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert get_reasoning_parser("qwen3").for_prompt(ids, tokenizer).prompt_state == state


def test_unknown_parser_lists_known():
    with pytest.raises(ValueError, match="deepseek_r1.*qwen3"):
        get_reasoning_parser("nope")
