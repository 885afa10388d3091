"""Structured outputs with xgrammar: the grammar a StructuredOutputsParams compiles to, and the
per-step token bitmask of the requests' matchers (compiling is grammar_compiler.py's).

A request's matcher lives on its Request (``req.grammar``) from admission until it finishes.
"""

from __future__ import annotations

import json
import re

import torch

from compiled_llm.sample.json_schema_support import unsupported_feature
from compiled_llm.sample.uploads import host_full
from compiled_llm.sampling_params import StructuredOutputsParams

_LOOSE_CHAR = r'[^\"\\\r\n]'
_JSON_CHAR = r'[^\0-\x1f\"\\\r\n]'


def choice_ebnf(choices: tuple[str, ...]) -> str:
    """EBNF whose language is exactly the given strings (JSON escapes are valid EBNF escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def grammar_text(xgr, spec: StructuredOutputsParams) -> str | None:
    """The EBNF spec compiles to, or None for a regex (compiled as one); a Lark grammar is
    converted by xgrammar. ValueError, KeyError, TypeError or xgrammar's errors for a spec it
    cannot build, ValueError naming the keyword for a JSON schema it would not enforce."""
    if spec.kind in ("json", "json_object"):
        any_whitespace = spec.json_any_whitespace
        schema = '{"type": "object"}' if spec.json_object else spec.json
        unenforced = unsupported_feature(schema)
        if unenforced:  # a grammar that would let invalid instances through: refused
            raise ValueError(f"{unenforced} is not supported (xgrammar would not enforce it)")
        grammar = xgr.Grammar.from_json_schema(
            schema, any_whitespace=any_whitespace,
            separators=None if any_whitespace else (",", ":"),
            strict_mode=not spec.json_object)
        # Length-bounded strings use a class that lets raw control characters through, which
        # JSON forbids; narrow it to the one unbounded strings use.
        return str(grammar).replace(_LOOSE_CHAR, _JSON_CHAR)
    if spec.kind == "choice":
        return choice_ebnf(spec.choice)
    if spec.kind == "structural_tag":
        return str(structural_tag_grammar(xgr, spec.structural_tag)).replace(_LOOSE_CHAR,
                                                                             _JSON_CHAR)
    if spec.kind == "regex":
        return None
    if grammar_is_lark(spec.grammar):  # vLLM's rule: EBNF has "::=", Lark does not
        return str(xgr.Grammar.from_lark(spec.grammar))
    return spec.grammar


def grammar_is_lark(grammar: str) -> bool:
    """Whether a grammar is Lark rather than EBNF/GBNF: no line outside comments (# or //)
    holds an EBNF rule's "::=" (vLLM's test, so the same text means the same language)."""
    return all("::=" not in re.sub(r"(#|//).*$", "", line) for line in grammar.splitlines())


def structural_tag_grammar(xgr, tag: str | dict):
    """xgrammar's Grammar of a structural tag (vLLM's forms): the legacy {"structures":
    [{begin, schema, end}], "triggers"} (free text until a trigger, then a tag whose content
    matches its schema), or xgrammar's own {"type": "structural_tag", "format": ...}."""
    tag = json.loads(tag) if isinstance(tag, str) else tag
    if "structures" in tag:
        structures = tag["structures"]
        if not isinstance(structures, list) or not all(
                isinstance(s, dict) and {"begin", "schema", "end"} <= s.keys()
                for s in structures):
            raise ValueError("structures must be a list of {begin, schema, end} objects")
        items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]),
                                       end=s["end"]) for s in structures]
        tag = xgr.StructuralTag.from_legacy_structural_tag(items, list(tag.get("triggers", [])))
        return xgr.Grammar.from_structural_tag(tag)
    return xgr.Grammar.from_structural_tag(json.dumps(tag))


def fill_bitmask(reqs: list, vocab_size: int, row_errors: dict[int, str] | None = None,
                 skip: frozenset[int] | set[int] = frozenset(),
                 device: torch.device | None = None) -> tuple[torch.Tensor | None, list[int]]:
    """One host bitmask [B, ceil(V/32)] int32 for the batch, and the rows it constrains; in
    pinned memory when `device` is CUDA, so that it goes to the device without a sync.

    Rows without a grammar (or in `skip`) are left all-allowed; (None, []) when no row has
    one. A matcher that raises fails its row alone (in row_errors, when given) and leaves it
    unconstrained.
    """
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None and i not in skip]
    if not rows:
        return None, []
    bitmask = host_full((len(reqs), -(-vocab_size // 32)), -1, torch.int32,
                        device or torch.device("cpu"))
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
    """Set disallowed logits to -inf, in place, with tensor ops on logits' device: rows
    without a grammar are all-allowed in the bitmask, so every row is masked and no row list
    goes to the device (`rows` is informational)."""
    # made per call: a cached device tensor would outlive the engine's device memory
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    vocab = logits.shape[-1]
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).flatten(1)[:, :vocab]
    logits.masked_fill_(allowed == 0, float("-inf"))


class ReasoningGate:
    """A matcher that leaves every token allowed until end_token_id (the end of a thinking
    span: one token, or a sequence of them accepted in a row) is accepted, then hands each
    step to the grammar's matcher: structured outputs apply to the reply after the thinking.
    Never terminated while the span is open."""

    def __init__(self, matcher, end_token_id: int | tuple[int, ...]) -> None:
        self.matcher, self.end_token_id = matcher, end_token_id
        self.end = (end_token_id,) if isinstance(end_token_id, int) else tuple(end_token_id)
        self.recent: tuple[int, ...] = ()  # the span's last tokens, as many as the end has
        self.open = True

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int) -> None:
        """The grammar's row once the span is over; all-allowed (as the batch's bitmask
        starts) while it lasts."""
        if not self.open:
            self.matcher.fill_next_token_bitmask(bitmask, index)
        else:
            bitmask[index].fill_(-1)

    def accept_token(self, token: int) -> bool:
        """Every token while the span lasts (its end token closes it); then the grammar's."""
        if self.open:
            self.recent = (*self.recent, token)[-len(self.end):]
            self.open = self.recent != self.end
            return True
        return self.matcher.accept_token(token)

    def is_terminated(self) -> bool:
        """Whether the grammar (after the span) reached its end."""
        return not self.open and self.matcher.is_terminated()
