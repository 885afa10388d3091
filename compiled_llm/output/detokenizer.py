"""Incremental detokenization and stop-string search for streamed generation.

Owns turning generated token ids into text deltas (vLLM's prefix/read-offset algorithm) and
the helpers that find stop strings in, and hold back possible stop prefixes from, that text.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Prompt tokens decoded ahead of the first generated token, so that tokenizers whose decoders
# strip a leading space from the first token (SentencePiece/Metaspace) give it its space.
PROMPT_CONTEXT_TOKENS = 5
# Consumed tokens are dropped once this many pile up, keeping memory and slicing bounded.
_COMPACT_AFTER = 512
REPLACEMENT_CHAR = "\ufffd"


def special_token_ids(tokenizer: "PreTrainedTokenizerBase") -> frozenset[int]:
    """The ids skip_special_tokens drops, as the tokenizer's own decode does: the named
    special tokens and every added token flagged special (Llama-3's <|start_header_id|>,
    ChatML's <|im_start|>), which all_special_ids does not list."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    flagged = (token_id for token_id, token in added.items() if getattr(token, "special", False))
    return frozenset(tokenizer.all_special_ids).union(flagged)


class IncrementalDetokenizer:
    """Turns generated token ids into text, one small window of tokens at a time.

    Each step decodes only tokens[prefix_offset:] (a few tokens) and emits the part past the
    decode of tokens[prefix_offset:read_offset], so cost per token is O(window), not O(output).
    Text that ends in U+FFFD (an incomplete multi-byte character) is held back until complete.

    Invariant (tested): if the prompt decodes to whole characters and decode(prompt + output)
    does not end in U+FFFD, decode(prompt) + output_text == decode(prompt + output); for
    byte-level BPE also output_text == decode(output). Not covered: output that completes a
    character begun in the prompt, and HF's ByteFallback decoder, which rewrites a whole run of
    byte tokens as U+FFFDs once any of it proves invalid UTF-8. spaces_between_special_tokens
    only affects slow tokenizers with added tokens (transformers 4 slow-decode semantics).
    """

    def __init__(
        self,
        tokenizer: "PreTrainedTokenizerBase",
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._spaces_between_special_tokens = spaces_between_special_tokens
        # Cached because these HF properties rebuild their collections on every access.
        self._vocab_len = len(tokenizer)
        self._skip_ids: frozenset[int] = (
            special_token_ids(tokenizer) if skip_special_tokens else frozenset()
        )
        added_vocab = tokenizer.get_added_vocab()
        self._added_tokens = frozenset(added_vocab)
        # Slow tokenizers' convert_tokens_to_string does not understand added tokens.
        self._split_added = not getattr(tokenizer, "is_fast", False) and bool(added_vocab)

        self._tokens: list[str] = self._ids_to_tokens(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self._prefix_text: str | None = None  # decode of tokens[prefix:read]; None = stale
        self._chunks: list[str] = []

    @property
    def output_text(self) -> str:
        """All text emitted so far (excludes any held-back incomplete character)."""
        if len(self._chunks) != 1:
            # Joined lazily so add_tokens stays O(1) instead of re-copying the whole string.
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0]

    def add_tokens(self, token_ids: list[int]) -> str:
        """Append generated token ids; return the newly decoded text ("" if none is ready)."""
        deltas = [self._step(token) for token in self._ids_to_tokens(token_ids)]
        delta = "".join(deltas)
        if delta:
            self._chunks.append(delta)
        return delta

    def truncate(self, n_chars: int) -> None:
        """Cut output_text to its first n_chars characters (e.g. at a stop string)."""
        self._chunks = [self.output_text[: max(n_chars, 0)]]

    def resume(self, token_ids: list[int], text: str) -> None:
        """Take over a request whose token_ids were already turned into text elsewhere.

        Decodes token_ids only to reach the state they leave behind; output_text becomes text.
        """
        self.add_tokens(token_ids)
        self._chunks = [text]

    def _ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        # Ids past the tokenizer (padded model vocab) and skipped specials carry no text.
        kept = [
            int(i) for i in token_ids if 0 <= i < self._vocab_len and int(i) not in self._skip_ids
        ]
        if not kept:
            return []
        tokens = self._tokenizer.convert_ids_to_tokens(kept)
        return [t for t in tokens if t is not None]

    def _step(self, token: str) -> str:
        self._tokens.append(token)
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        prefix_text = self._prefix_text
        new_text = self._decode(self._tokens[self._prefix_offset :])
        # Nothing new, or the last character is still missing bytes: wait for more tokens.
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._tokens)
        self._prefix_text = None
        if self._prefix_offset > _COMPACT_AFTER:
            del self._tokens[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return new_text[len(prefix_text) :]

    def _decode(self, tokens: list[str]) -> str:
        if not self._split_added:
            return self._tokenizer.convert_tokens_to_string(tokens)
        # Mirror HF slow decode: runs of ordinary tokens are decoded separately and added
        # tokens are kept verbatim, optionally space-separated.
        pieces: list[str] = []
        run: list[str] = []
        for token in tokens:
            if token in self._added_tokens:
                if run:
                    pieces.append(self._tokenizer.convert_tokens_to_string(run))
                    run = []
                pieces.append(token)
            else:
                run.append(token)
        if run:
            pieces.append(self._tokenizer.convert_tokens_to_string(run))
        return (" " if self._spaces_between_special_tokens else "").join(pieces)


def find_stop_string(
    text: str, num_new_chars: int, stop: Sequence[str], include_stop_str_in_output: bool
) -> tuple[str, int] | None:
    """Find a stop string that ends within the last num_new_chars characters of text.

    Returns (stop string, length to truncate text to) or None. Among matches, the one that
    completes earliest wins (ties: the one starting earliest), i.e. the same answer as if the
    text had arrived one character at a time, so token boundaries never change the outcome.
    Earlier text is assumed to have been checked already and is not searched.
    """
    if num_new_chars <= 0:
        return None
    new_start = max(len(text) - num_new_chars, 0)
    best: tuple[int, int, str] | None = None  # (end, start, stop string)
    for stop_str in stop:
        if not stop_str:
            continue
        # A match must end inside the new text, so it starts at most len(stop_str)-1 before it.
        start = text.find(stop_str, max(new_start - len(stop_str) + 1, 0))
        if start == -1:
            continue
        candidate = (start + len(stop_str), start, stop_str)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    if best is None:
        return None
    end, start, stop_str = best
    return stop_str, end if include_stop_str_in_output else start


def held_back_chars(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of text could be the start of a stop string.

    The largest k such that text ends with stop_str[:k] for some stop_str with
    len(stop_str) > k; a streaming consumer must not show those characters yet.
    """
    longest = max((len(s) - 1 for s in stop), default=0)
    for k in range(min(longest, len(text)), 0, -1):
        tail = text[-k:]
        if any(len(s) > k and s.startswith(tail) for s in stop):
            return k
    return 0
