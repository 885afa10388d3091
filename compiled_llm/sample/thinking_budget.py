"""A thinking-token budget: a logits processor that, once a reply has spent its budget of
tokens inside a thinking span, allows only the span's end token (vLLM's
thinking_token_budget). Stateless over the output ids (one instance serves n choices)."""

from __future__ import annotations

import torch


class ThinkingBudget:
    """Forces end_token_id after `budget` thinking tokens. The span starts with the reply
    when open_in_prompt, else after start_token_id as the reply's first token (no span, no
    forcing). Picklable, so it travels to the engine-core process."""

    def __init__(self, budget: int, end_token_id: int, start_token_id: int | None,
                 open_in_prompt: bool) -> None:
        if budget < 0:
            raise ValueError(f"thinking_token_budget must be >= 0, got {budget}")
        self.budget, self.end_token_id = budget, end_token_id
        self.start_token_id, self.open_in_prompt = start_token_id, open_in_prompt

    def _span_start(self, output_ids: list[int]) -> int | None:
        if self.open_in_prompt:
            return 0
        if output_ids and output_ids[0] == self.start_token_id:
            return 1
        return None

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        """logits, or only the end token allowed when the open span reached the budget."""
        start = self._span_start(output_ids)
        if start is None or len(output_ids) - start != self.budget:
            return logits  # only the step right at the budget can need forcing
        if self.end_token_id in output_ids[start:]:
            return logits
        forced = torch.full_like(logits, float("-inf"))
        forced[self.end_token_id] = 0.0
        return forced
