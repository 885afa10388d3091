"""gpt-oss's harmony replies: the openai_gptoss reasoning parser (analysis channel as
reasoning, final channel and preambles as content, whole and streamed), the `openai` tool
parser (messages to functions.NAME), the grammar gate on the end's token sequence, and the
server picking the parser for a gpt-oss model by default, as vLLM does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from compiled_llm.entrypoints.reasoning_parsers import get_reasoning_parser
from compiled_llm.entrypoints.server.reply import ReplyFormat, reasoning_token_count, reply_params
from compiled_llm.entrypoints.server.serving import Serving
from compiled_llm.entrypoints.server.tool_calls import ToolPlan
from compiled_llm.entrypoints.tool_parsers.base import ToolCallStreamer
from compiled_llm.entrypoints.tool_parsers.harmony import HarmonyToolParser
from compiled_llm.sample.structured_outputs import ReasoningGate
from compiled_llm.sample.structured_params import StructuredOutputsParams
from compiled_llm.sampling_params import SamplingParams
from tests.utils import tokenizer_dir

ANALYSIS = "<|channel|>analysis<|message|>"
NEXT = "<|end|><|start|>assistant"
CALL = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris"}')
# (reply, reasoning, content without the calls)
CASES = [
    (f"{ANALYSIS}Add them.{NEXT}<|channel|>final<|message|>4", "Add them.", "4"),
    (f"{ANALYSIS}cut off", "cut off", ""),
    ("<|channel|>final<|message|>At once.", None, "At once."),
    (f"{ANALYSIS}a{NEXT}{ANALYSIS}b{NEXT}<|channel|>final<|message|>c", "a\nb", "c"),
    (f"{ANALYSIS}Look it up.{NEXT}<|channel|>commentary<|message|>Checking.{NEXT}{CALL}",
     "Look it up.", "Checking."),
    ("plain text, no channels", None, "plain text, no channels"),
    ("tea, then<|channel|>final<|message|>The answer.", None, "tea, then\nThe answer."),
    (" to=functions.get_weather<|channel|>commentary json<|message|>{}", None, ""),
]


def _parser(keep_calls=False):
    parser = get_reasoning_parser("openai_gptoss")()
    parser.keep_calls = keep_calls
    return parser


@pytest.mark.parametrize(("reply", "reasoning", "content"), CASES)
def test_whole_reply(reply, reasoning, content):
    assert _parser().split(reply, True) == (reasoning, content)


@pytest.mark.parametrize(("reply", "reasoning", "content"), CASES)
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_streamed_reply_is_prefix_stable(reply, reasoning, content, chunk):
    parser, sent = _parser(), ("", "")
    for end in range(0, len(reply) + 1, chunk):
        got = parser.split(reply[:end], False)
        got = (got[0] or "", got[1])
        assert got[0].startswith(sent[0]) and got[1].startswith(sent[1]), (sent, got)
        assert "<|" not in got[0] + got[1]  # no marker leaks while it is written
        sent = got
    assert (reasoning or "").startswith(sent[0]) and content.startswith(sent[1])


def test_calls_reach_the_openai_tool_parser():
    reply = f"{ANALYSIS}Look it up.{NEXT}<|channel|>commentary<|message|>Checking.{NEXT}{CALL}"
    reasoning, rest = _parser(keep_calls=True).split(reply, True)
    assert reasoning == "Look it up."
    content, calls = HarmonyToolParser().extract(rest)
    assert content == "Checking."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize("chunk", [1, 4])
def test_streamed_call_adds_up(chunk):
    rest = _parser(keep_calls=True).split(f"{ANALYSIS}x{NEXT}{CALL}", True)[1]
    streamer, deltas = ToolCallStreamer(HarmonyToolParser().parse), []
    for start in range(0, len(rest), chunk):
        content, calls = streamer.feed(rest[start:start + chunk])
        assert content == ""
        deltas += calls
    deltas += streamer.feed("", True)[1]
    assert deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Paris"}'


def test_recipient_first_in_the_reply_is_a_call():
    """After the prompt's `<|start|>assistant` the reply may name the recipient first."""
    reply = " to=functions.lookup<|channel|>commentary json<|message|>{\"q\": 1}"
    rest = _parser(keep_calls=True).split(reply, True)[1]
    assert HarmonyToolParser().extract(rest)[1][0]["function"] == {
        "name": "lookup", "arguments": '{"q": 1}'}


def test_recipient_before_the_channel_and_other_recipients():
    text = ('<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}'
            '<|call|>')
    assert HarmonyToolParser().extract(text)[1][0]["function"]["name"] == "lookup"
    browse = '<|channel|>commentary to=browser.search<|message|>{"q": 1}'
    assert HarmonyToolParser().extract(browse) == (None, [])  # a built-in tool: no call


def _tokenizer():
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": [
        "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>"]})
    return tok


def test_grammar_waits_for_the_final_channel_tokens():
    tok = _tokenizer()
    params = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(
        json={"type": "object"}))
    params = reply_params(params, ReplyFormat(ToolPlan(), _parser()), tok, None)
    end = params.structured_outputs.reasoning_end_token_id
    assert isinstance(end, tuple) and len(end) >= 3
    assert tok.decode(list(end)) == "<|channel|>final<|message|>"
    assert params.skip_special_tokens is False


def test_gate_needs_the_whole_sequence_in_a_row():
    accepted = []
    matcher = SimpleNamespace(accept_token=lambda t: accepted.append(t) or True,
                              is_terminated=lambda: False)
    gate = ReasoningGate(matcher, (7, 8, 9))
    for token in (7, 8, 5, 8, 9, 7, 8):
        assert gate.accept_token(token) and gate.open
    gate.accept_token(9)
    assert not gate.open and accepted == []
    gate.accept_token(4)
    assert accepted == [4]


def test_end_sequence_validated_and_counted():
    spec = StructuredOutputsParams(json={"type": "object"}, reasoning_end_token_id=[3, 4])
    assert spec.reasoning_end_token_id == (3, 4)
    for bad in ([], ["a"], (1, -2)):
        with pytest.raises(ValueError, match="reasoning_end_token_id"):
            StructuredOutputsParams(json={"type": "object"}, reasoning_end_token_id=bad)
    assert reasoning_token_count("r", [1, 3, 4, 9], (3, 4)) == 3
    assert reasoning_token_count("r", [1, 3, 9], (3, 4)) == 3  # still open: every token


@pytest.mark.parametrize(("model_type", "flag", "expected"), [
    ("gpt_oss", None, "GptOssReasoningParser"), ("llama", None, None),
    ("gpt_oss", "qwen3", "Qwen3ReasoningParser")])
def test_gpt_oss_reads_harmony_by_default(model_type, flag, expected):
    engine = SimpleNamespace(tokenizer=_tokenizer(), model_config=SimpleNamespace(
        hf_config=SimpleNamespace(model_type=model_type)))
    serving = SimpleNamespace(cfg=SimpleNamespace(reasoning_parser=flag), engine=engine)
    reply = Serving.reply_format(serving, ToolPlan(mode="auto", parser=HarmonyToolParser()), [])
    assert type(reply.reasoning).__name__ == expected or reply.reasoning is expected
    if expected == "GptOssReasoningParser":
        assert reply.reasoning.keep_calls
        assert not Serving.reply_format(serving, ToolPlan(), []).reasoning.keep_calls
