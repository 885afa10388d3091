"""The token that ends a request by EOS or by stop_token_ids adds no text (vLLM's
detokenizer), unless include_stop_str_in_output; the same text whether it is made while the
request runs (incremental, DELTA or CUMULATIVE) or once at the finish (a batched decode)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from compiled_llm import LLM, SamplingParams
from compiled_llm.core.engine_output import EngineCoreOutput
from compiled_llm.core.request import Request
from compiled_llm.output.output_processor import OutputProcessor, completion_of, delta_of
from compiled_llm.sampling_params import RequestOutputKind
from tests.utils import make_chatml_checkpoint

IM_END = 2  # the tokenizer's EOS
# (output kind, logprobs): the batched final decode (with and without per-token work), and
# the incremental detokenizer read cumulatively and as deltas
PATHS = [(RequestOutputKind.FINAL_ONLY, None), (RequestOutputKind.FINAL_ONLY, 1),
         (RequestOutputKind.CUMULATIVE, None), (RequestOutputKind.DELTA, None)]


@pytest.fixture(scope="module")
def checkpoint():
    return make_chatml_checkpoint()


@pytest.fixture(scope="module")
def tok(checkpoint):
    return AutoTokenizer.from_pretrained(checkpoint)


def _generate(tok, ids: list[int], finish: str, stop_reason, path, split: bool = False,
              **params) -> tuple[str, list[int]]:
    """(text, token_ids) of a request the core ends with ids, through OutputProcessor;
    split: the last token comes in an output of its own."""
    kind, logprobs = path
    proc = OutputProcessor(tok)
    prompt = tok("Hello there")["input_ids"]
    state = proc.start(Request("r", prompt, SamplingParams(
        max_tokens=16, output_kind=kind, logprobs=logprobs, **params)))
    chunks = [ids[:-1], ids[-1:]] if split else [ids]
    text = ""
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        rows = None if logprobs is None else [([t], [-0.5], 1) for t in chunk]
        proc.process([EngineCoreOutput("r", chunk, rows, finish_reason=finish if last else None,
                                       stop_reason=stop_reason if last else None)])
        if kind is RequestOutputKind.DELTA:
            text += delta_of(state, 0).text
    out = completion_of(state, 0)
    assert out.finish_reason == finish
    return (text if kind is RequestOutputKind.DELTA else out.text), out.token_ids


def _words(tok) -> tuple[list[int], int]:
    """Some text's ids, and a plain word token to stop on."""
    ids = tok("The quick brown fox", add_special_tokens=False)["input_ids"]
    return ids, tok(" over", add_special_tokens=False)["input_ids"][-1]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_stop_token_id_leaves_no_text(tok, path, split):
    ids, stop = _words(tok)
    text, token_ids = _generate(tok, [*ids, stop], "stop", stop, path, split,
                                stop_token_ids=[stop])
    assert text == tok.decode(ids) and token_ids == [*ids, stop]
    kept, _ = _generate(tok, [*ids, stop], "stop", stop, path, split, stop_token_ids=[stop],
                        include_stop_str_in_output=True)
    assert kept == tok.decode([*ids, stop])


@pytest.mark.parametrize("path", PATHS)
def test_eos_text_stays_out_with_special_tokens_kept(tok, path):
    ids, _ = _words(tok)
    text, token_ids = _generate(tok, [*ids, IM_END], "stop", None, path,
                                skip_special_tokens=False)
    assert text == tok.decode(ids) and token_ids == [*ids, IM_END]
    alone, _ = _generate(tok, [IM_END], "stop", None, path, skip_special_tokens=False)
    assert alone == ""
    kept, _ = _generate(tok, [*ids, IM_END], "stop", None, path, skip_special_tokens=False,
                        include_stop_str_in_output=True)
    assert kept == tok.decode(ids) + "<|im_end|>"


@pytest.mark.parametrize("path", PATHS)
def test_a_length_finish_keeps_its_last_token(tok, path):
    ids, stop = _words(tok)
    text, _ = _generate(tok, [*ids, stop], "length", None, path, stop_token_ids=[stop + 1])
    assert text == tok.decode([*ids, stop])


def test_stop_string_is_still_cut(tok):
    ids, stop = _words(tok)
    text, _ = _generate(tok, [*ids, stop], "stop", None, PATHS[2], stop=["brown"])
    assert text == "The quick "


def test_llm_generate_forced_eos_has_no_text(checkpoint):
    llm = LLM(checkpoint, enforce_eager=True, dtype="float32", device="cpu")
    forced = SamplingParams(temperature=0, max_tokens=5, logit_bias={IM_END: 100.0},
                            skip_special_tokens=False)
    out = llm.generate(["hello"], forced, use_tqdm=False)[0].outputs[0]
    assert (out.text, out.token_ids, out.finish_reason) == ("", [IM_END], "stop")
    streamed = SamplingParams(temperature=0, max_tokens=5, stop_token_ids=[IM_END + 2],
                              logit_bias={IM_END + 2: 100.0}, stop=["zz"])
    out = llm.generate(["hello"], streamed, use_tqdm=False)[0].outputs[0]
    assert (out.text, out.stop_reason) == ("", IM_END + 2)
