"""SamplingParams.bad_words as vLLM applies them: each word's token sequences (as written and
after a leading space), and a logits processor that bans the last token of a sequence wherever
the output already ends with the rest of it (a one-token word is always banned)."""

from __future__ import annotations

import torch


def bad_word_sequences(tokenizer, words: list[str], vocab_size: int) -> list[list[int]]:
    """The token sequences to ban, vLLM's way: each word (leading whitespace dropped) as
    written, and after a space where that tokenizes to another first token of the same
    length. ValueError naming bad_words for a word without tokens or outside the vocabulary."""
    if tokenizer is None:
        raise ValueError("bad_words need a tokenizer")
    sequences: list[list[int]] = []
    for word in words:
        plain = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not plain:
            raise ValueError(f"bad_words: {word!r} has no tokens")
        sequences.append(plain)
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    bad = [t for seq in sequences for t in seq if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"bad_words must tokenize to ids in [0, {vocab_size}), got {bad[:5]}")
    return sequences


class BadWordsProcessor:
    """Bans each sequence's last token when the output ends with the tokens before it.
    Stateless over the output ids (one instance serves n children); picklable, so it
    travels to the engine-core process."""

    def __init__(self, sequences: list[list[int]]) -> None:
        self.always = sorted({seq[0] for seq in sequences if len(seq) == 1})
        self.after = [(seq[:-1], seq[-1]) for seq in sequences if len(seq) > 1]

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        """logits with this step's banned ids at -inf (in place)."""
        banned = list(self.always)
        for prefix, last in self.after:
            if len(output_ids) >= len(prefix) and output_ids[-len(prefix):] == prefix:
                banned.append(last)
        if banned:
            logits[banned] = float("-inf")
        return logits
