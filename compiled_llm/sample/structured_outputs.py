"""Structured outputs: grammar compilation of a request's StructuredOutputsParams with
xgrammar (once per spec, cached), per-request matchers, and the per-step token bitmask.

A request's matcher lives on its Request (``req.grammar``) from admission until it finishes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import torch

from compiled_llm.sampling_params import StructuredOutputsParams

_CACHE_SIZE = 256
_LOOSE_CHAR = r'[^\"\\\r\n]'
_JSON_CHAR = r'[^\0-\x1f\"\\\r\n]'


def choice_ebnf(choices: tuple[str, ...]) -> str:
    """EBNF whose language is exactly the given strings (JSON escapes are valid EBNF escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarManager:
    """Compiles specs for one tokenizer and vocab (LRU-cached by spec) and hands out matchers.

    vocab_size is the model's: ids past the tokenizer's vocabulary are never allowed.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None)
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self._cache: OrderedDict[tuple, Any] = OrderedDict()

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar for spec; ValueError naming the field if it does not compile."""
        key = spec.key()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        try:
            compiled = self._compile(spec)
        except RuntimeError as exc:  # xgrammar reports parse errors as RuntimeError
            reason = str(exc).strip().splitlines()[-1].split(": ", 1)[-1]
            raise ValueError(f"structured_outputs.{spec.kind} is invalid: {reason}") from None
        self._cache[key] = compiled
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: StructuredOutputsParams):
        compiler = self._compiler
        if spec.kind in ("json", "json_object"):
            return compiler.compile_grammar(self._json_ebnf(spec))
        if spec.kind == "regex":
            return compiler.compile_regex(spec.regex)
        if spec.kind == "choice":
            return compiler.compile_grammar(choice_ebnf(spec.choice))
        return compiler.compile_grammar(spec.grammar)

    def _json_ebnf(self, spec: StructuredOutputsParams) -> str:
        any_whitespace = spec.any_whitespace
        schema = '{"type": "object"}' if spec.json_object else spec.json
        grammar = self._xgr.Grammar.from_json_schema(
            schema, any_whitespace=any_whitespace,
            separators=None if any_whitespace else (",", ":"),
            strict_mode=not spec.json_object)
        # Length-bounded strings use a class that lets raw control characters through, which
        # JSON forbids; narrow it to the one unbounded strings use.
        return str(grammar).replace(_LOOSE_CHAR, _JSON_CHAR)

    @property
    def num_cached(self) -> int:
        """Compiled grammars held in the LRU cache."""
        return len(self._cache)

    def matcher(self, spec: StructuredOutputsParams):
        """A fresh matcher at the start of spec's grammar."""
        return self._xgr.GrammarMatcher(self.compile(spec))


def fill_bitmask(reqs: list, vocab_size: int, row_errors: dict[int, str] | None = None
                 ) -> tuple[torch.Tensor | None, list[int]]:
    """One host bitmask [B, ceil(V/32)] int32 for the batch, and the rows it constrains.

    Rows without a grammar are left all-allowed; (None, []) when no row has one. A matcher
    that raises fails its row alone (in row_errors, when given) and leaves it unconstrained.
    """
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
    if not rows:
        return None, []
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(reqs), vocab_size)
    failed = []
    for i in rows:
        try:
            reqs[i].grammar.fill_next_token_bitmask(bitmask, i)
        except Exception as exc:  # third-party code: contain it to its request
            if row_errors is None:
                raise
            row_errors[i] = f"structured_outputs failed: {type(exc).__name__}: {exc}"
            bitmask[i].fill_(-1)
            failed.append(i)
    rows = [i for i in rows if i not in failed]
    return (bitmask, rows) if rows else (None, [])


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set disallowed logits of the given rows to -inf, in place, on logits' device."""
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=rows)
