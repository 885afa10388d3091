"""Tests for compiled_llm.output.detokenizer on tokenizers trained locally (no hub access)."""

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import ByT5Tokenizer, PreTrainedTokenizerFast

from compiled_llm.output.detokenizer import (
    IncrementalDetokenizer,
    find_stop_string,
    held_back_chars,
)
from compiled_llm.output.fast_detokenizer import make_detokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello there!",
    "Café naïve résumé façade déjà vu crème brûlée, the world of words.",
    "日本語のテキストと中文文本。東京は大きい。世界、こんにちは。",
    "Emoji time 😀😃😄 🎉🎉 👍 ❤️ 👨‍👩‍👧 world 😀 hello",
    "Ünïcödé çhàràctèrs ñ ß ø å æ œ over the world",
] * 20
SAMPLES = ["Hello world", "Café 東京 😀 🦀 done", "  spaced  out\nlines\tand tabs", "é", "🦀🦀"]
PROMPT = "The quick brown fox says"
# Its last few tokens start mid-character, so the seeded decode window starts with U+FFFDs.
MULTIBYTE_PROMPT = "Tokyo 🦀🦀東京"
HYPO = settings(max_examples=60, deadline=None, database=None)


def _train_bpe(words: Counter[str], alphabet: list[str], n_merges: int) -> list[tuple[str, str]]:
    """Deterministic BPE merges (the tokenizers trainers break count ties at random)."""
    splits = {w: list(w) for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in pairwise(splits[word]):
                pairs[pair] += count
        if not pairs:
            break
        a, b = max(pairs, key=lambda p: (pairs[p], p))
        merges.append((a, b))
        for parts in splits.values():
            i = 0
            while i < len(parts) - 1:
                if parts[i] == a and parts[i + 1] == b:
                    parts[i : i + 2] = [a + b]
                i += 1
    return merges


def _vocab(pieces: list[str]) -> dict[str, int]:
    return {p: i for i, p in enumerate(dict.fromkeys(pieces))}


def _byte_level() -> PreTrainedTokenizerFast:
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = Counter(w for line in CORPUS for w, _ in pre.pre_tokenize_str(line))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = _train_bpe(words, alphabet, 150)
    tok = Tokenizer(models.BPE(_vocab(alphabet + [a + b for a, b in merges]), merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>"])
    tok.add_tokens(["<tool>"])  # an added token that is not special, so never skipped
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )


def _sentencepiece_bpe() -> tuple[list[str], list[tuple[str, str]]]:
    """Pieces and merges over "▁"-prefixed words, as SentencePiece learns them (🦀, tabs and
    newlines are unseen, so they hit byte fallback or <unk>)."""
    words = Counter("▁" + w for line in CORPUS for w in line.split())
    alphabet = sorted({c for w in words for c in w})
    merges = _train_bpe(words, alphabet, 120)
    return alphabet + [a + b for a, b in merges], merges


def _llama2_bpe() -> PreTrainedTokenizerFast:
    """SentencePiece-BPE the way Llama-2's tokenizer.json expresses it, with byte fallback."""
    pieces, merges = _sentencepiece_bpe()
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    vocab = _vocab(["<unk>", "<s>", "</s>", *byte_pieces, *pieces])
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def _metaspace_unigram() -> PreTrainedTokenizerFast:
    # Equal scores: Viterbi picks the fewest pieces. Unseen characters become <unk>.
    scores = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)]
    scores += [(p, -1.0) for p in dict.fromkeys(_sentencepiece_bpe()[0])]
    tok = Tokenizer(models.Unigram(scores, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


TOKENIZERS = {
    "byte_level": _byte_level(),
    "llama2_bpe": _llama2_bpe(),
    "metaspace_unigram": _metaspace_unigram(),
    "byt5_slow": ByT5Tokenizer(),
}
SENTENCEPIECE = ["llama2_bpe", "metaspace_unigram"]


@pytest.fixture(scope="module", params=[IncrementalDetokenizer, make_detokenizer],
                ids=["python", "fast"])
def make_det(request):
    """Each invariant test runs on the Python algorithm and on what make_detokenizer picks."""
    return request.param


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _stream(make, tok, prompt_ids, output_ids, chunks=None, **kwargs) -> tuple[str, list[str]]:
    """Feed output_ids in the given chunk sizes (default one id at a time)."""
    det = make(tok, prompt_ids, **kwargs)
    deltas, pos = [], 0
    for size in chunks or [1] * len(output_ids):
        deltas.append(det.add_tokens(output_ids[pos : pos + size]))
        pos += size
    deltas.append(det.add_tokens(output_ids[pos:]))
    assert "".join(deltas) == det.output_text
    return det.output_text, deltas


def _random_ids(name: str) -> st.SearchStrategy[int]:
    tok = TOKENIZERS[name]
    ids = st.integers(0, len(tok) - 1)
    if name == "llama2_bpe":
        # HF's ByteFallback decoder turns a whole run of byte tokens into U+FFFDs if any of it is
        # invalid UTF-8, retroactively changing text already streamed; only valid runs (drawn
        # below from real text) can be expected to match.
        return ids.filter(lambda i: not tok.convert_ids_to_tokens(i).startswith("<0x"))
    return ids


@st.composite
def _generation(draw):
    """A mix of random ids (specials, added tokens and, for byte-level BPE, lone bytes) and
    encoded multi-byte text, ending in a plain ASCII token so that the decode ends cleanly."""
    name = draw(st.sampled_from(sorted(TOKENIZERS)))
    tok = TOKENIZERS[name]
    text_ids = st.text("aé東😀🦀 \n", max_size=6).map(lambda t: _encode(tok, t))
    pieces = draw(st.lists(st.one_of(_random_ids(name).map(lambda i: [i]), text_ids), max_size=20))
    ids = [i for piece in pieces for i in piece] + _encode(tok, "x")[-1:]
    chunks = draw(st.lists(st.integers(1, 4), max_size=len(ids)))
    return (
        name,
        ids,
        chunks,
        draw(st.booleans()),
        draw(st.sampled_from(["", PROMPT, MULTIBYTE_PROMPT])),
    )


@HYPO
@given(_generation())
def test_random_ids_match_full_decode(make_det, case):
    name, ids, chunks, skip, prompt = case
    tok = TOKENIZERS[name]
    prompt_ids = _encode(tok, prompt)
    kwargs = {"skip_special_tokens": skip, "spaces_between_special_tokens": False}
    text, _ = _stream(make_det, tok, prompt_ids, ids, chunks, **kwargs)
    full = tok.decode(prompt_ids + ids, skip_special_tokens=skip)
    assert tok.decode(prompt_ids, skip_special_tokens=skip) + text == full
    if name not in SENTENCEPIECE or not prompt:
        assert text == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@pytest.mark.parametrize("sample", SAMPLES)
def test_encoded_text_round_trips(make_det, name, sample):
    tok = TOKENIZERS[name]
    prompt_ids = _encode(tok, PROMPT)
    # Encoding prompt + sample together is what a model continuing the prompt would emit.
    full_ids = _encode(tok, PROMPT + " " + sample)
    assert full_ids[: len(prompt_ids)] == prompt_ids
    ids = full_ids[len(prompt_ids) :]
    text, _ = _stream(make_det, tok, prompt_ids, ids)
    full = tok.decode(prompt_ids + ids, skip_special_tokens=True)
    assert tok.decode(prompt_ids, skip_special_tokens=True) + text == full


@pytest.mark.parametrize("name", ["byte_level", "llama2_bpe", "byt5_slow"])
def test_emoji_split_across_byte_tokens_waits_until_complete(make_det, name):
    tok = TOKENIZERS[name]
    prompt_ids = _encode(tok, "Hi")
    full_ids = _encode(tok, "Hi🦀")  # 🦀 is not in the training corpus, so it splits into bytes
    assert full_ids[: len(prompt_ids)] == prompt_ids
    ids = full_ids[len(prompt_ids) :]
    assert len(ids) >= 2
    _, deltas = _stream(make_det, tok, prompt_ids, ids)
    assert deltas[: len(ids)] == [""] * (len(ids) - 1) + ["🦀"]


def test_incomplete_character_is_not_emitted_at_end(make_det):
    tok = TOKENIZERS["byte_level"]
    ids = _encode(tok, "ok 🦀")
    text, _ = _stream(make_det, tok, [], ids[:-1])
    assert text == "ok" or text == "ok "
    assert "\ufffd" not in text


@pytest.mark.parametrize("name", SENTENCEPIECE)
def test_first_generated_token_keeps_leading_space(make_det, name):
    tok = TOKENIZERS[name]
    prompt_ids = _encode(tok, "Hello")
    ids = _encode(tok, "world")  # a word-initial piece, "▁w..."
    assert tok.convert_ids_to_tokens(ids)[0].startswith("▁")
    assert tok.decode(prompt_ids + ids) == "Hello world"
    assert tok.decode(ids) == "world"  # decoding the output alone drops the space
    assert _stream(make_det, tok, prompt_ids, ids)[0] == " world"
    assert _stream(make_det, tok, [], ids)[0] == "world"  # no prompt: nothing to seed with


@pytest.mark.parametrize("name", ["byte_level", "llama2_bpe", "metaspace_unigram"])
@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(make_det, name, skip):
    tok = TOKENIZERS[name]
    eos = tok.eos_token_id
    ids = _encode(tok, "Hello") + [eos] + _encode(tok, "world") + [eos]
    prompt_ids = _encode(tok, PROMPT)
    text, _ = _stream(make_det, tok, prompt_ids, ids, skip_special_tokens=skip)
    assert (tok.eos_token in text) is not skip
    full = tok.decode(prompt_ids + ids, skip_special_tokens=skip)
    assert tok.decode(prompt_ids, skip_special_tokens=skip) + text == full


def test_slow_tokenizer_added_tokens_spacing(make_det):
    tok = TOKENIZERS["byt5_slow"]
    ids = _encode(tok, "a") + tok.convert_tokens_to_ids(["<extra_id_0>"]) + _encode(tok, "bé")
    text = _stream(make_det, tok, [], ids, skip_special_tokens=False)[0]
    assert text == "a <extra_id_0> bé"
    kwargs = {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    text = _stream(make_det, tok, [], ids, **kwargs)[0]
    assert text == "a<extra_id_0>bé" == tok.decode(ids)
    assert _stream(make_det, tok, [], ids)[0] == "abé"


def test_out_of_range_ids_are_ignored(make_det):
    tok = TOKENIZERS["byte_level"]
    ids = _encode(tok, "Hello world")
    assert _stream(make_det, tok, [], [len(tok) + 7, *ids, -1, 10**6])[0] == "Hello world"


def test_long_generation_decodes_only_a_small_window(monkeypatch):
    tok = TOKENIZERS["byte_level"]
    ids = _encode(tok, "the world, hello there 😀. ") * 300
    decoded_lengths = []
    convert = tok.convert_tokens_to_string

    def spy(tokens):
        decoded_lengths.append(len(tokens))
        return convert(tokens)

    monkeypatch.setattr(tok, "convert_tokens_to_string", spy)
    det = IncrementalDetokenizer(tok, [])
    for i in ids:
        det.add_tokens([i])
    assert det.output_text == tok.decode(ids)
    assert max(decoded_lengths) <= 8
    assert len(det._tokens) < 1024  # consumed tokens are compacted away


def test_truncate(make_det):
    tok = TOKENIZERS["byte_level"]
    det = make_det(tok, [])
    det.add_tokens(_encode(tok, "Hello world"))
    det.truncate(5)
    assert det.output_text == "Hello"
    assert det.add_tokens(_encode(tok, "!")) == "!"
    assert det.output_text == "Hello!"


def _stream_stops(text, cuts, stop, include):
    """Feed text in pieces, checking stops after each one as an engine would."""
    pos = 0
    for cut in [*sorted(cuts), len(text)]:
        if cut <= pos:
            continue
        found = find_stop_string(text[:cut], cut - pos, stop, include)
        if found:
            return found
        pos = cut
    return None


def _reference_stop(text, stop, include):
    """Brute force: scan one character at a time for the first completed stop string."""
    for end in range(1, len(text) + 1):
        for s in sorted(stop, key=len, reverse=True):
            if s and text[:end].endswith(s):
                return s, end if include else end - len(s)
    return None


@HYPO
@given(
    st.text("abc", max_size=30),
    st.lists(st.integers(0, 30), max_size=8),
    st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=3),
    st.booleans(),
)
def test_stop_string_independent_of_chunking(text, cuts, stop, include):
    assert _stream_stops(text, cuts, stop, include) == _reference_stop(text, stop, include)


@pytest.mark.parametrize(("include", "expected"), [(False, ("STOP1", 6)), (True, ("STOP1", 11))])
def test_first_stop_occurrence_wins(include, expected):
    text = "Hello STOP1 and STOP2"
    assert find_stop_string(text, len(text), ["STOP2", "STOP1"], include) == expected


def test_overlapping_stops_first_to_complete_wins():
    # Char-by-char streaming would see "bc" complete before "abcd", so chunking can't matter.
    assert find_stop_string("xabcd", 4, ["abcd", "bc"], False) == ("bc", 2)
    # Same end: the longer (earlier-starting) one.
    assert find_stop_string("xabc", 4, ["bc", "abc"], False) == ("abc", 1)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@pytest.mark.parametrize("stop", ["\n\nUser:", "é 🦀!"])
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundaries(make_det, name, stop, include):
    tok = TOKENIZERS[name]
    if tok.decode(_encode(tok, stop), skip_special_tokens=True) != stop:
        pytest.skip("the stop string has characters this tokenizer maps to <unk>")
    assert len(_encode(tok, stop)) > 1
    det = make_det(tok, _encode(tok, PROMPT))
    found = None
    for i in _encode(tok, "Hello world" + stop + " more" + stop):
        delta = det.add_tokens([i])
        found = find_stop_string(det.output_text, len(delta), ["never", stop], include)
        if found:
            det.truncate(found[1])
            break
    assert found is not None and found[0] == stop
    # SentencePiece output keeps the space its first piece "▁Hello" carries after the prompt.
    head = " Hello world" if name in SENTENCEPIECE else "Hello world"
    assert det.output_text == head + (stop if include else "")


def test_find_stop_string_only_searches_new_region():
    assert find_stop_string("STOP then more", 4, ["STOP"], False) is None
    assert find_stop_string("xxSTO", 1, ["STOP"], True) is None
    assert find_stop_string("xxSTOP", 1, ["STOP"], True) == ("STOP", 6)
    assert find_stop_string("xxSTOP", 0, ["STOP"], True) is None
    assert find_stop_string("xxSTOP", 3, [], True) is None
    assert find_stop_string("xxSTOP", 3, [""], True) is None


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        ("Hello wor", ["world"], 3),
        ("Hello", ["world"], 0),
        ("ab", ["abc", "bcd"], 2),
        ("a", ["a"], 0),  # a full match is not a prefix to hold back
        ("xxab", ["abab"], 2),
        ("aba", ["abab"], 3),
        ("", ["abc"], 0),
        ("abc", [], 0),
        ("café 😀", ["😀!", "é 😀?"], 3),
    ],
)
def test_held_back_chars(text, stop, expected):
    assert held_back_chars(text, stop) == expected


@HYPO
@given(st.text("ab", max_size=10), st.lists(st.text("ab", max_size=5), max_size=3))
def test_held_back_chars_matches_brute_force(text, stop):
    expected = max(
        [k for s in stop for k in range(1, len(s)) if k <= len(text) and text.endswith(s[:k])],
        default=0,
    )
    assert held_back_chars(text, stop) == expected
