"""Detokenization through the tokenizers library's own incremental decoder (DecodeStream).

Owns make_detokenizer (which picks DecodeStream or the Python algorithm per tokenizer) and
FastDetokenizer, which gives the same text as IncrementalDetokenizer at a fraction of its cost.
"""

from __future__ import annotations

import copy
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenizers.decoders import DecodeStream

from compiled_llm.output.detokenizer import (
    PROMPT_CONTEXT_TOKENS,
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    special_token_ids,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Decoders for which decode(a + b) starts with decode(a) whenever decode(a) does not end in
# U+FFFD, and whose text for b does not depend on where the decoded window starts. For those,
# DecodeStream's byte-length comparisons and window moves give the Python algorithm's text.
# ByteFallback holds only outside runs of byte tokens, which the checks below route around.
# WordPiece and CTC are left out: their cleanup rewrites text across token boundaries.
_MONOTONE_DECODERS = frozenset(
    {"ByteLevel", "Metaspace", "Replace", "Strip", "Fuse", "ByteFallback", "BPEDecoder"}
)
_PLANS: weakref.WeakKeyDictionary[Any, DecodePlan] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class DecodePlan:
    """What one tokenizer's detokenizers need, computed once (the tokenizer is not changed
    after its first request)."""

    backend: Any  # tokenizers.Tokenizer, or None where DecodeStream cannot match the text
    vocab_len: int
    special_ids: frozenset[int]
    byte_ids: frozenset[int]  # ByteFallback's <0xHH> tokens; empty without ByteFallback

    def keep(self, token_ids: Sequence[int], skip_special_tokens: bool) -> list[int]:
        """The ids that carry text, filtered exactly as IncrementalDetokenizer filters them."""
        skip = self.special_ids if skip_special_tokens else frozenset()
        # The usual case, a list with nothing to drop, is checked by C loops.
        if type(token_ids) is list and (
            not token_ids
            or (
                min(token_ids) >= 0
                and max(token_ids) < self.vocab_len
                and skip.isdisjoint(token_ids)
            )
        ):
            return token_ids.copy()
        return [int(i) for i in token_ids if 0 <= i < self.vocab_len and int(i) not in skip]


def _decoder_types(state: dict | None) -> set[str]:
    if state is None:
        return set()
    if state.get("type") == "Sequence":
        return set().union(*(_decoder_types(d) for d in state["decoders"]))
    return {state.get("type", "?")}


def _build_plan(tokenizer: PreTrainedTokenizerBase) -> DecodePlan:
    backend = getattr(tokenizer, "backend_tokenizer", None) if tokenizer.is_fast else None
    types: set[str] = set()
    if backend is not None:
        decoder = backend.decoder
        types = _decoder_types(None if decoder is None else json.loads(decoder.__getstate__()))
        if not types <= _MONOTONE_DECODERS:
            backend = None
    byte_ids: frozenset[int] = frozenset()
    if backend is not None and "ByteFallback" in types:
        found = (backend.token_to_id(f"<0x{byte:02X}>") for byte in range(256))
        byte_ids = frozenset(i for i in found if i is not None)
    return DecodePlan(backend, len(tokenizer), special_token_ids(tokenizer), byte_ids)


def plan_for(tokenizer: PreTrainedTokenizerBase) -> DecodePlan:
    """The cached DecodePlan of tokenizer (built on first use)."""
    try:
        plan = _PLANS.get(tokenizer)
    except TypeError:  # not weak-referenceable: build every time
        return _build_plan(tokenizer)
    if plan is None:
        plan = _PLANS[tokenizer] = _build_plan(tokenizer)
    return plan


class FastDetokenizer:
    """IncrementalDetokenizer's interface and text, decoded by DecodeStream in Rust.

    Invariant (tested against IncrementalDetokenizer over random ids and chunkings):
    add_tokens returns the same deltas and output_text is the same string, however the ids are
    grouped into calls. Several ids are decoded in one DecodeStream call when that cannot change
    the text; where DecodeStream rejects a window (its prefix check), the request replays its ids
    into an IncrementalDetokenizer and carries on there.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._prompt_token_ids = prompt_token_ids
        self._skip_special_tokens = skip_special_tokens
        self._spaces_between_special_tokens = spaces_between_special_tokens
        self._plan = plan_for(tokenizer)
        self._vocab_len = self._plan.vocab_len
        self._skip_ids = self._plan.special_ids if skip_special_tokens else frozenset()
        context = self._plan.keep(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:], skip_special_tokens)
        self._stream = DecodeStream(context, skip_special_tokens=False)
        self._ids: list[int] = []  # every id decoded so far, replayed if the stream gives up
        self._chunks: list[str] = []
        self._python: IncrementalDetokenizer | None = None

    @property
    def output_text(self) -> str:
        """All text emitted so far (excludes any held-back incomplete character)."""
        if self._python is not None:
            return self._python.output_text
        if len(self._chunks) != 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0]

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """Append generated token ids; return the newly decoded text ("" if none is ready)."""
        if self._python is not None:
            return self._python.add_tokens(token_ids)
        if len(token_ids) == 1:  # the common step, kept short: a few attribute loads
            token = int(token_ids[0])
            keep = 0 <= token < self._vocab_len and token not in self._skip_ids
            delta = self._decode_one(token) if keep else ""
        else:
            kept = self._plan.keep(token_ids, self._skip_special_tokens)
            delta = self._decode_batch(kept) if kept else ""
        if delta and self._python is None:
            self._chunks.append(delta)
        return delta

    def truncate(self, n_chars: int) -> None:
        """Cut output_text to its first n_chars characters (e.g. at a stop string)."""
        if self._python is not None:
            self._python.truncate(n_chars)
        else:
            self._chunks = [self.output_text[: max(n_chars, 0)]]

    def _decode_batch(self, kept: list[int]) -> str:
        # One call for the whole group gives the per-id text unless the group ends inside a
        # character (the per-id loop would emit the text before it) or has byte-fallback tokens
        # (a run of them can turn into U+FFFDs after part of it was emitted).
        if self._plan.byte_ids.isdisjoint(kept):
            saved = copy.copy(self._stream)
            try:
                text = self._stream.step(self._plan.backend, kept)
            except Exception:  # the prefix check: the per-id loop finds the id that broke it
                text = None
            if text is not None:
                self._ids.extend(kept)
                return text
            self._stream = saved
        return self._decode_each(kept)

    def _decode_one(self, token: int) -> str:
        try:
            piece = self._stream.step(self._plan.backend, token)
        except Exception:  # DecodeStream's prefix check failed; the Python algorithm goes on
            return self._switch_to_python([token], "")
        self._ids.append(token)
        return piece or ""

    def _decode_each(self, kept: list[int]) -> str:
        pieces: list[str] = []
        backend = self._plan.backend
        for pos, token in enumerate(kept):
            try:
                piece = self._stream.step(backend, token)
            except Exception:  # as in _decode_one
                return "".join(pieces) + self._switch_to_python(kept[pos:], "".join(pieces))
            self._ids.append(token)
            if piece:
                pieces.append(piece)
        return "".join(pieces)

    def _switch_to_python(self, rest: list[int], pending: str) -> str:
        python = IncrementalDetokenizer(
            self._tokenizer,
            self._prompt_token_ids,
            self._skip_special_tokens,
            self._spaces_between_special_tokens,
        )
        python.resume(self._ids, self.output_text + pending)
        self._python = python
        return python.add_tokens(rest)


def make_detokenizer(
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: list[int],
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
) -> FastDetokenizer | IncrementalDetokenizer:
    """The fastest detokenizer that gives IncrementalDetokenizer's exact text for this request.

    FastDetokenizer for fast tokenizers whose decoder is known to suit DecodeStream and whose
    prompt context decodes to whole characters; IncrementalDetokenizer otherwise.
    """
    plan = plan_for(tokenizer)
    if plan.backend is not None:
        context = plan.keep(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:], skip_special_tokens)
        # DecodeStream drops a context that ends inside a character (and would emit its text).
        if not plan.backend.decode(context, skip_special_tokens=False).endswith(REPLACEMENT_CHAR):
            return FastDetokenizer(
                tokenizer, prompt_token_ids, skip_special_tokens, spaces_between_special_tokens
            )
    return IncrementalDetokenizer(
        tokenizer, prompt_token_ids, skip_special_tokens, spaces_between_special_tokens
    )
