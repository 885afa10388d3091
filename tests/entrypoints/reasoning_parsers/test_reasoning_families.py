"""The reasoning parsers of further families (vLLM's names): each reply split whole and
streamed in chunks (reasoning before content, prefix-stable), thinking on and off by the
prompt's state and by chat_template_kwargs, unterminated spans; the prompt's state read from
one-token tags and from the text of several-token ones; the sampling changes they ask for."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

from compiled_llm.entrypoints.reasoning_parsers import get_reasoning_parser
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.reply import ReplyFormat, reply_params
from compiled_llm.entrypoints.server.serving import Serving
from compiled_llm.entrypoints.server.tool_calls import ToolPlan
from compiled_llm.sample.structured_params import StructuredOutputsParams
from compiled_llm.sampling_params import SamplingParams
from tests.utils import tokenizer_dir

ON = {"thinking": True}
# (parser, prompt state, chat_template_kwargs, reply, reasoning, content)
CASES = [
    ("deepseek_v3", "open", ON, "2+2 is 4.</think>The answer is 4.", "2+2 is 4.",
     "The answer is 4."),
    ("deepseek_v3", "open", {"enable_thinking": True}, "cut off", "cut off", ""),
    ("deepseek_v3", "closed", None, "Plain <think>a</think> answer.", None,
     "Plain <think>a</think> answer."),
    ("deepseek_v3", "closed", {"thinking": False}, "x</think>y", None, "x</think>y"),
    ("granite", "none", ON, "Here is my thought process:\nAdd.\nHere is my response:\n4",
     "\nAdd.\n", "\n4"),
    ("granite", "none", None, "Here's my thought process: a Here's my response: b", " a ",
     " b"),
    ("granite", "none", None, "Here is a plain answer: 4", None, "Here is a plain answer: 4"),
    ("granite", "none", ON, "Here is my thought process: still going", " still going", ""),
    ("mistral", "none", None, "[THINK]Add them.[/THINK]4", "Add them.", "4"),
    ("mistral", "none", None, "4, at once.", None, "4, at once."),
    ("mistral", "none", None, "[THINK]unfinished", "unfinished", ""),
    ("seed_oss", "none", None, "<seed:think>Sum.</seed:think>4", "Sum.", "4"),
    ("seed_oss", "none", None, "Sum.</seed:think>4", "Sum.", "4"),
    ("seed_oss", "closed", None, "4", None, "4"),
    ("minimax_m2", "open", None, "Sum.\n</think>\n\n4", "Sum.\n", "\n\n4"),
    ("minimax_m2", "open", None, "no end yet", "no end yet", ""),
    ("minimax_m2_append_think", "open", None, "Sum.</think>4", None, "<think>Sum.</think>4"),
    ("ernie45", "none", None, "abc\n</think>\n\n<response>\ndef\n</response>\n", "abc\n",
     "def"),
    ("ernie45", "none", None, "abc\n</think>\ndef", "abc\n", "\ndef"),
    ("ernie45", "none", None, "abc\n</think>\n\n<response>\nde", "abc\n", "de"),
    ("ernie45", "closed", None, "def", None, "def"),
    ("hunyuan_a13b", "none", None, "<think>\nSum.\n</think>\n<answer>\n4\n</answer>", "Sum.",
     "4"),
    ("hunyuan_a13b", "none", None, "<think>\n\n</think>\n<answer>\n4\n</answer>", None, "4"),
    ("hunyuan_a13b", "none", None, "4 at once", None, "4 at once"),
    ("hunyuan_a13b", "none", None, "<think>\nstill", "still", ""),
    ("olmo3", "open", None, "Sum.</think>4", "Sum.", "4"),
    ("olmo3", "none", None, "<think>Sum.</think>4", "Sum.", "4"),
    ("olmo3", "closed", None, "4", None, "4"),
]


def _parser(name, state, kwargs):
    cls = get_reasoning_parser(name)
    return cls(state, cls.thinking_on(kwargs))


@pytest.mark.parametrize(("name", "state", "kwargs", "reply", "reasoning", "content"), CASES)
def test_whole_reply(name, state, kwargs, reply, reasoning, content):
    assert _parser(name, state, kwargs).split(reply, True) == (reasoning, content)


@pytest.mark.parametrize("size", [1, 2, 5])
@pytest.mark.parametrize(("name", "state", "kwargs", "reply", "reasoning", "content"), CASES)
def test_streamed_reply(name, state, kwargs, reply, reasoning, content, size):
    """Reasoning deltas all come before content deltas and add up to the whole split."""
    streamer = ReplyFormat(ToolPlan(), _parser(name, state, kwargs)).streamer()
    got = {"reasoning_content": "", "content": ""}
    order = []
    pieces = [reply[i:i + size] for i in range(0, len(reply), size)]
    for i, piece in enumerate(pieces):
        delta = streamer.feed(piece, i == len(pieces) - 1)
        for key in ("reasoning_content", "content"):
            if key in delta:
                got[key] += delta[key]
                order.append(key)
    assert got == {"reasoning_content": reasoning or "", "content": content}
    assert order == sorted(order, key=lambda key: key == "content")


@functools.cache
def _tokenizer():
    """Mistral's tags and turn markers as special tokens, Seed-OSS's as plain added ones;
    <think> and Granite's markers are several tokens."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["[INST]", "[/INST]", "[THINK]",
                                                          "[/THINK]", "<|im_start|>"]})
    tok.add_tokens(["<seed:think>", "</seed:think>"])
    return tok


SYSTEM = "[THINK]draft[/THINK] then answer"  # Magistral's system prompt shows its tags
PROMPTS = [
    ("mistral", SYSTEM + "[INST]q[/INST]", "none"),
    ("mistral", "[INST]q[/INST][THINK]", "open"),
    ("seed_oss", "<seed:think>x</seed:think>", "closed"),
    ("seed_oss", "[INST]q[/INST]<seed:think>", "open"),
    ("olmo3", "<|im_start|>assistant\n<think>", "open"),
    ("olmo3", "<think>a</think><|im_start|>assistant\n", "none"),
    ("olmo3", "<|im_start|>assistant\n<think>\n</think>\n", "closed"),
    ("hunyuan_a13b", "<|im_start|>assistant\n<think>\n\n</think>\n", "closed"),
    ("granite", "Here is my thought process: x<|im_start|>assistant", "none"),
]


@pytest.mark.parametrize(("name", "prompt", "state"), PROMPTS)
def test_prompt_state(name, prompt, state):
    """The current turn's last tag decides, read from the ids where each tag is one token
    and from the decoded turn otherwise."""
    tok = _tokenizer()
    ids = tok.encode(prompt, add_special_tokens=False)
    assert get_reasoning_parser(name).for_prompt(ids, tok).prompt_state == state


def test_template_kwargs_turn_deepseek_v3_thinking_on():
    tok = _tokenizer()
    cls = get_reasoning_parser("deepseek_v3")
    assert not cls.for_prompt([], tok).may_think
    assert not cls.for_prompt([], tok).starts_thinking  # a thinking budget forces nothing
    assert not cls.for_prompt([], tok, {"thinking": False}).may_think
    assert cls.for_prompt([], tok, {"thinking": True}).starts_thinking
    assert get_reasoning_parser("seed_oss").for_prompt([], tok, None).may_think


def _params():
    return SamplingParams(max_tokens=8,
                          structured_outputs=StructuredOutputsParams(json={"type": "object"}))


def test_structured_outputs_wait_for_a_one_token_end():
    tok = _tokenizer()
    reply = ReplyFormat(ToolPlan(), get_reasoning_parser("mistral")("none"))
    params = reply_params(_params(), reply, tok, None)
    assert params.structured_outputs.reasoning_end_token_id == tok.convert_tokens_to_ids(
        "[/THINK]")
    assert params.skip_special_tokens is False  # [THINK] is a control token: kept in text


def test_special_tags_stay_in_the_text():
    """A tag that is a special token of the tokenizer keeps special tokens in the decoded
    reply (else the split never sees it); plain added tags leave the default."""
    import transformers

    assert get_reasoning_parser("seed_oss").keeps_special_tokens(_tokenizer()) is False
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<seed:think>", "</seed:think>"]})
    assert get_reasoning_parser("seed_oss").keeps_special_tokens(tok) is True
    assert get_reasoning_parser("qwen3").keeps_special_tokens(tok) is False


@pytest.mark.parametrize(("name", "kwargs"), [("olmo3", None), ("granite", ON)])
def test_structured_outputs_refused_where_the_end_is_several_tokens(name, kwargs):
    reply = ReplyFormat(ToolPlan(), _parser(name, "none", kwargs))
    with pytest.raises(OpenAIError, match="not one token"):
        reply_params(_params(), reply, _tokenizer(), None)


def test_structured_outputs_from_the_start_where_thinking_is_off():
    reply = ReplyFormat(ToolPlan(), _parser("granite", "none", None))
    params = reply_params(_params(), reply, _tokenizer(), None)
    assert params.structured_outputs.reasoning_end_token_id is None


def test_server_reads_the_request_template_kwargs():
    serving = SimpleNamespace(cfg=SimpleNamespace(reasoning_parser="deepseek_v3"),
                              engine=SimpleNamespace(tokenizer=_tokenizer()))
    off = Serving.reply_format(serving, ToolPlan(), [])
    on = Serving.reply_format(serving, ToolPlan(), [], {"thinking": True})
    assert off.message("a</think>b", "stop")[0]["content"] == "a</think>b"
    message = on.message("a</think>b", "stop")[0]
    assert (message["reasoning_content"], message["content"]) == ("a", "b")
