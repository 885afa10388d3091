"""Gemma 4's reasoning parser (vLLM's gemma4): the <|channel>thought\\n...<channel|> span split
whole and streamed (prefix-stable, no tag or label leaking), its calls read by the gemma4
tool parser from the content after it, the prompt's state and thinking switch read from a
Gemma 4-like tokenizer and template, and the grammar gate on the one-token end."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

from compiled_llm.entrypoints.reasoning_parsers import get_reasoning_parser
from compiled_llm.entrypoints.server.reply import ReplyFormat, reply_params
from compiled_llm.entrypoints.server.serving import Serving
from compiled_llm.entrypoints.server.tool_calls import ToolPlan
from compiled_llm.entrypoints.tool_parsers import get_tool_parser
from compiled_llm.sample.structured_params import StructuredOutputsParams
from compiled_llm.sampling_params import SamplingParams
from tests.entrypoints.tool_parsers.test_tool_parsers import TOOLS
from tests.utils import tokenizer_dir

GEMMA4 = get_reasoning_parser("gemma4")
OPEN, CLOSE, Q = "<|channel>", "<channel|>", '<|"|>'
CALL = f"<|tool_call>call:get_time{{zone:{Q}CET{Q}}}<tool_call|>"
# (prompt state, reply, reasoning, content)
CASES = [
    ("none", f"{OPEN}thought\nThe user wants 2+2.{CLOSE}4", "The user wants 2+2.", "4"),
    ("none", "4 at once.", None, "4 at once."),
    ("none", f"{OPEN}thought\nstill going", "still going", ""),
    ("none", f"{OPEN}thought\n{CLOSE}4", "", "4"),  # the empty channel: no thoughts
    ("none", f"{OPEN}thoughtful{CLOSE}x", "thoughtful", "x"),  # no label to drop
    ("none", f"{OPEN}thou", "thou", ""),
    ("closed", "4", None, "4"),
    ("closed", "4 < 5 <|chan", None, "4 < 5 <|chan"),
    ("open", f"thought\nSum.{CLOSE}4", "Sum.", "4"),  # the prompt opened the channel
]


@pytest.mark.parametrize(("state", "reply", "reasoning", "content"), CASES)
def test_whole_reply(state, reply, reasoning, content):
    assert GEMMA4(state).split(reply, True) == (reasoning, content)


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize(("state", "reply", "reasoning", "content"), CASES)
def test_streamed_reply(state, reply, reasoning, content, size):
    """Each partial split extends the one before (no tag, partial tag or label goes out and
    is taken back); the deltas add up to the whole split, reasoning before content."""
    parser, before = GEMMA4(state), ("", "")
    for end in range(0, len(reply) + 1, size):
        got = parser.split(reply[:end], False)
        now = (got[0] or "", got[1])
        assert now[0].startswith(before[0]) and now[1].startswith(before[1]), reply[:end]
        assert reasoning is None or (reasoning or "").startswith(now[0])
        assert content.startswith(now[1]), reply[:end]
        before = now
    streamer = ReplyFormat(ToolPlan(), GEMMA4(state)).streamer()
    out, order = {"reasoning_content": "", "content": ""}, []
    pieces = [reply[i:i + size] for i in range(0, len(reply), size)]
    for i, piece in enumerate(pieces):
        delta = streamer.feed(piece, i == len(pieces) - 1)
        for key in ("reasoning_content", "content"):
            if key in delta:
                out[key] += delta[key]
                order.append(key)
    assert out == {"reasoning_content": reasoning or "", "content": content}
    assert order == sorted(order, key=lambda key: key == "content")


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize(("reply", "content"), [
    (f"{OPEN}thought\nNeed the time.{CLOSE}{CALL}", None),
    (f"{OPEN}thought\nNeed the time.{CLOSE}Checking.{CALL}", "Checking.")])
def test_calls_after_the_channel(reply, content, size):
    """The gemma4 tool parser sees only the text after the channel: the thinking is
    reasoning, never content, whole and streamed."""
    plan = ToolPlan("auto", TOOLS, parser=get_tool_parser("gemma4")(TOOLS))
    reply_format = ReplyFormat(plan, GEMMA4("none"))
    message, finish = reply_format.message(reply, "stop")
    assert (message["reasoning_content"], message["content"]) == ("Need the time.", content)
    assert finish == "tool_calls"
    call = {"name": "get_time", "arguments": '{"zone": "CET"}'}
    assert [c["function"] for c in message["tool_calls"]] == [call]
    streamer, text, arguments = reply_format.streamer(), {"reasoning": "", "content": ""}, ""
    pieces = [reply[i:i + size] for i in range(0, len(reply), size)]
    for i, piece in enumerate(pieces):
        delta = streamer.feed(piece, i == len(pieces) - 1)
        text["reasoning"] += delta.get("reasoning_content", "")
        text["content"] += delta.get("content", "")
        arguments += "".join(c["function"]["arguments"] for c in delta.get("tool_calls", []))
    assert text == {"reasoning": "Need the time.", "content": content or ""}
    assert arguments == call["arguments"]


# Gemma 4's thinking switch: enable_thinking puts <|think|> in a system turn; some templates
# write an empty channel after the generation prompt when thinking is off
TEMPLATE = (
    "{% if enable_thinking %}<|turn>system\n<|think|><turn|>\n{% endif %}"
    "{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n"
    "{% if empty_channel and not enable_thinking %}<|channel>thought\n<channel|>{% endif %}"
    "{% endif %}")


@functools.cache
def _tokenizer():
    """The test BPE with Gemma 4's markers as special tokens and a Gemma 4-like template."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": [
        "<|turn>", "<turn|>", "<|think|>", OPEN, CLOSE, "<|tool_call>", "<tool_call|>",
        "<|tool_response>", "<tool_response|>", Q]})
    tok.chat_template = TEMPLATE
    return tok


PAST = f"<|turn>model\n{OPEN}thought\na{CLOSE}b<turn|>\n<|turn>user\nq<turn|>\n"
PROMPTS = [  # (prompt, its state, whether grammars wait for the channel's end)
    ("<|turn>system\n<|think|><turn|>\n<|turn>user\nq<turn|>\n<|turn>model\n", "none", True),
    (f"<|turn>user\nq<turn|>\n<|turn>model\n{OPEN}thought\n{CLOSE}", "closed", False),
    ("<|turn>user\nq<turn|>\n<|turn>model\n", "none", False),  # thinking never asked for
    (f"<|turn>system\n<|think|><turn|>\n{PAST}<|turn>model\n", "none", True),
    (f"<|think|>{PAST}<|turn>model\n{OPEN}", "open", True),
    # a finished tool exchange in the model's turn: it may think afresh
    (f"<|think|><|turn>model\n{OPEN}thought\nx{CLOSE}{CALL}<|tool_response>response:"
     "get_time{t:1}<tool_response|>", "none", True),
    (f"<|think|><|turn>model\n{CALL}", "closed", False),
]


@pytest.mark.parametrize(("prompt", "state", "may_think"), PROMPTS)
def test_prompt_state(prompt, state, may_think):
    tok = _tokenizer()
    parser = GEMMA4.for_prompt(tok.encode(prompt, add_special_tokens=False), tok)
    assert (parser.prompt_state, parser.may_think) == (state, may_think)
    assert parser.starts_thinking is (state == "open")


@pytest.mark.parametrize("empty_channel", [False, True])
def test_template_kwargs_turn_thinking_on(empty_channel):
    """enable_thinking (chat_template_kwargs) reaches the parser through the prompt it
    renders, as vLLM reads it: on, grammars wait for <channel|>; off, they apply at once.
    A reply that opens with the channel is reasoning either way."""
    tok = _tokenizer()
    serving = SimpleNamespace(cfg=SimpleNamespace(reasoning_parser="gemma4"),
                              engine=SimpleNamespace(tokenizer=tok))
    messages = [{"role": "user", "content": "q"}]
    for on in (False, True):
        kwargs = {"enable_thinking": on, "empty_channel": empty_channel}
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                      return_dict=False, **kwargs)
        reply = Serving.reply_format(serving, ToolPlan(), list(ids), kwargs)
        assert reply.reasoning.may_think is on
        assert reply.end_id == tok.convert_tokens_to_ids(CLOSE)
        message = reply.message(f"{OPEN}thought\nr{CLOSE}c", "stop")[0]
        assert (message["reasoning_content"], message["content"]) == ("r", "c")


def test_grammar_waits_for_the_channel_end_token():
    tok = _tokenizer()
    assert GEMMA4.end_ids(tok) == tok.convert_tokens_to_ids(CLOSE)  # one token: no sequence
    assert GEMMA4.keeps_special_tokens(tok) and not GEMMA4.skip_special_tokens
    for asked, gate in ((True, tok.convert_tokens_to_ids(CLOSE)), (False, None)):
        params = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(
            json={"type": "object"}))
        params = reply_params(params, ReplyFormat(ToolPlan(), GEMMA4("none", asked=asked)),
                              tok, None)
        assert params.structured_outputs.reasoning_end_token_id == gate
        assert params.skip_special_tokens is False
