"""FastDetokenizer, make_detokenizer and the one-shot decode give IncrementalDetokenizer's text,
on the locally built tokenizers of test_detokenizer (no hub access)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from compiled_llm.output.detokenizer import IncrementalDetokenizer
from compiled_llm.output.fast_detokenizer import FastDetokenizer, make_detokenizer
from compiled_llm.output.final_decode import decode_output, decode_outputs
from tests.output.test_detokenizer import MULTIBYTE_PROMPT, PROMPT, TOKENIZERS, _encode

HYPO = settings(max_examples=150, deadline=None, database=None)
# The last one ends inside 🦀, which DecodeStream would drop from its context.
PROMPTS = ["", PROMPT, MULTIBYTE_PROMPT, "Hi 🦀"]


def _prompt_ids(tok, index: int) -> list[int]:
    ids = _encode(tok, PROMPTS[index])
    return ids[:-1] if index == 3 else ids


@st.composite
def _case(draw):
    """Any ids at all (lone bytes, byte-fallback runs, specials, ids past the vocabulary) mixed
    with encoded multi-byte text, cut into groups of 1-6 as an engine step would hand them."""
    name = draw(st.sampled_from(sorted(TOKENIZERS)))
    tok = TOKENIZERS[name]
    single = st.integers(-2, len(tok) + 2).map(lambda i: [i])
    text = st.text("aé東😀🦀 \n", max_size=6).map(lambda t: _encode(tok, t))
    ids = [i for part in draw(st.lists(st.one_of(single, text), max_size=16)) for i in part]
    chunks = draw(st.lists(st.integers(1, 6), max_size=len(ids)))
    prompt = _prompt_ids(tok, draw(st.integers(0, len(PROMPTS) - 1)))
    return tok, prompt, ids, chunks, draw(st.booleans()), draw(st.integers(-1, 12))


@HYPO
@given(_case())
def test_same_deltas_as_python_algorithm(case):
    tok, prompt, ids, chunks, skip, cut_at = case
    python = IncrementalDetokenizer(tok, prompt, skip, False)
    fast = make_detokenizer(tok, prompt, skip, False)
    pos = 0
    for step, size in enumerate([*chunks, len(ids)]):
        group = ids[pos : pos + size]
        pos += size
        assert fast.add_tokens(group) == python.add_tokens(group)
        assert fast.output_text == python.output_text
        if step == cut_at:  # as a stop string would
            python.truncate(len(python.output_text) // 2)
            fast.truncate(len(fast.output_text) // 2)


@HYPO
@given(_case())
def test_one_shot_decode_matches_incremental(case):
    tok, prompt, ids, _, skip, _ = case
    det = IncrementalDetokenizer(tok, prompt, skip, False)
    det.add_tokens(ids)
    assert decode_output(tok, prompt, ids, skip, False) == det.output_text


@HYPO
@given(st.lists(_case(), min_size=1, max_size=6))
def test_batched_one_shot_decode_matches_incremental(cases):
    tok = cases[0][0]
    cases = [case for case in cases if case[0] is tok]
    expected = []
    for _, prompt, ids, _, skip, _ in cases:
        det = IncrementalDetokenizer(tok, prompt, skip, True)
        det.add_tokens(ids)
        expected.append(det.output_text)
    prompts, outputs, skips = ([case[k] for case in cases] for k in (1, 2, 4))
    assert decode_outputs(tok, prompts, outputs, skips, True) == expected


@pytest.mark.parametrize(
    ("name", "prompt_index", "kind"),
    [
        ("byte_level", 1, FastDetokenizer),
        ("llama2_bpe", 1, FastDetokenizer),
        ("metaspace_unigram", 2, FastDetokenizer),
        ("byt5_slow", 1, IncrementalDetokenizer),  # a slow tokenizer
        ("byte_level", 3, IncrementalDetokenizer),  # the prompt ends inside a character
    ],
)
def test_factory_choice(name, prompt_index, kind):
    tok = TOKENIZERS[name]
    assert type(make_detokenizer(tok, _prompt_ids(tok, prompt_index))) is kind


def test_unlisted_decoder_keeps_python_algorithm():
    # WordPiece's cleanup rewrites text across token boundaries ("a ." -> "a.").
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "##b": 3, ".": 4, "'": 5, "s": 6}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert type(make_detokenizer(tok, [])) is IncrementalDetokenizer


def test_invalid_byte_run_hands_over_to_python_algorithm():
    tok = TOKENIZERS["llama2_bpe"]
    # <0x41> ("A") then <0xE6>: HF's ByteFallback rewrites the whole run as U+FFFDs, which
    # DecodeStream's prefix check rejects once the text ends cleanly again.
    ids = tok.convert_tokens_to_ids(["<0x41>", "<0xE6>"]) + _encode(tok, "x") + _encode(tok, "ok")
    python = IncrementalDetokenizer(tok, [])
    fast = make_detokenizer(tok, [])
    assert [fast.add_tokens([i]) for i in ids] == [python.add_tokens([i]) for i in ids]
    assert fast._python is not None
    assert fast.output_text == python.output_text


class _CountingStream:
    """Wraps a DecodeStream and counts its step calls."""

    def __init__(self, stream) -> None:
        self.stream, self.calls = stream, 0

    def step(self, backend, ids):
        """Forward to DecodeStream.step."""
        self.calls += 1
        return self.stream.step(backend, ids)


def test_a_step_of_ids_is_one_decode_call():
    tok = TOKENIZERS["byte_level"]
    det = make_detokenizer(tok, _encode(tok, PROMPT))
    det._stream = counting = _CountingStream(det._stream)
    ids = _encode(tok, " hello world, the quick brown fox")
    assert det.add_tokens(ids) == tok.decode(ids)
    assert counting.calls == 1


def test_group_ending_inside_a_character_emits_the_text_before_it():
    tok = TOKENIZERS["byte_level"]
    ids = _encode(tok, "ok 🦀")
    fast = make_detokenizer(tok, [])
    head = fast.add_tokens(ids[:-1])
    assert head in ("ok", "ok ")
    assert head + fast.add_tokens(ids[-1:]) == "ok 🦀"
