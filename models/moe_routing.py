"""Router variants of MoE layers, router logits [T, E] -> (weights float32, ids int64) [T, K]:
softmax top-k (Mixtral, Qwen-MoE), sigmoid scores with a selection-only correction bias
(DeepSeek-V3's noaux_tc), grouped top-k (DeepSeek-V2/V3: the best groups of experts first),
softmax top-k over its p-norm (DBRX) and PhiMoE's sparsemixer.
Plain torch with static shapes, so Inductor compiles them inside the model graph.
"""

from __future__ import annotations

import torch


def _finish(weights: torch.Tensor, ids: torch.Tensor, renormalize: bool, scale: float,
            eps: float = 0.0, floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    if renormalize:  # a saturated router's top-k may sum to 0: the model's guard, no NaN
        total = weights.sum(dim=-1, keepdim=True)
        total = total + eps if eps else total
        weights = weights / (total.clamp(min=floor) if floor else total)
    if scale != 1.0:
        weights = weights * scale
    return weights, ids


def _scores(router_logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "softmax":
        return torch.softmax(router_logits.float(), dim=-1)
    if scoring_func == "sigmoid":
        return torch.sigmoid(router_logits.float())
    raise ValueError(f"scoring_func must be 'softmax' or 'sigmoid', got {scoring_func!r}")


def softmax_topk(router_logits: torch.Tensor, top_k: int,
                 renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The top_k of softmax(logits) per token, renormalised to sum 1 when asked."""
    weights, ids = torch.topk(_scores(router_logits, "softmax"), top_k, dim=-1)
    return _finish(weights, ids, renormalize, 1.0)


def sigmoid_topk(router_logits: torch.Tensor, top_k: int, correction_bias: torch.Tensor | None,
                 renormalize: bool,
                 routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The top_k experts by sigmoid(logits) + correction_bias; the weights are the unbiased
    sigmoid scores of those experts (renormalised when asked), times routed_scaling_factor."""
    return grouped_topk(router_logits, top_k, 1, 1, renormalize, "sigmoid", correction_bias,
                        routed_scaling_factor)


def _group_scores(choice: torch.Tensor, num_groups: int, biased: bool) -> torch.Tensor:
    grouped = choice.view(choice.shape[0], num_groups, -1)  # [T, G, E/G]
    if biased:  # DeepSeek-V3: a group is as good as the sum of its two best experts
        return grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
    return grouped.amax(dim=-1)  # DeepSeek-V2: as good as its best expert


def grouped_topk(router_logits: torch.Tensor, top_k: int, num_groups: int, topk_group: int,
                 renormalize: bool, scoring_func: str = "softmax",
                 correction_bias: torch.Tensor | None = None,
                 routed_scaling_factor: float = 1.0, renorm_eps: float = 0.0,
                 renorm_floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The top_k experts among the topk_group best of num_groups equal groups of experts.
    With correction_bias, selection reads scores + bias and the weights the plain scores.
    Renormalised, the weights are divided by max(sum + renorm_eps, renorm_floor) (DeepSeek-V3's
    + 1e-20, ERNIE 4.5's moe_norm_min), as the models guard a top-k that sums to 0."""
    num_experts = router_logits.shape[-1]
    if num_experts % num_groups or not 1 <= topk_group <= num_groups:
        raise ValueError(f"grouped_topk: {num_experts} experts do not split into {num_groups} "
                         f"groups with topk_group={topk_group}")
    scores = _scores(router_logits, scoring_func)
    choice = scores if correction_bias is None else scores + correction_bias.float()
    group_scores = _group_scores(choice, num_groups, correction_bias is not None)
    best_groups = group_scores.topk(topk_group, dim=-1).indices  # [T, topk_group]
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    expert_mask = group_mask.repeat_interleave(num_experts // num_groups, dim=-1)  # [T, E]
    ids = choice.masked_fill(~expert_mask, float("-inf")).topk(top_k, dim=-1).indices
    return _finish(scores.gather(1, ids), ids, renormalize, routed_scaling_factor, renorm_eps,
                   renorm_floor)


def softmax_topk_pnorm(router_logits: torch.Tensor, top_k: int,
                       p: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The top_k of softmax(logits), divided by their p-norm unless p is None (DBRX's
    moe_normalize_expert_weights: p = 1 renormalises to sum 1)."""
    weights, ids = torch.topk(_scores(router_logits, "softmax"), top_k, dim=-1)
    if p is None:
        return weights, ids
    return weights / torch.linalg.vector_norm(weights, ord=p, dim=-1, keepdim=True), ids


def sparsemixer_top2(router_logits: torch.Tensor,
                     jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's sparsemixer at inference: the best expert, then the best other one; each
    weighted by its softmax over the logits within 2 * jitter_eps (relative) of its own."""
    scores = router_logits.float()

    def pick(masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        best, ids = masked.max(dim=-1, keepdim=True)
        far = (best - scores) / scores.abs().clamp(min=best) > 2 * jitter_eps
        return masked.masked_fill(far, float("-inf")).softmax(-1).gather(-1, ids), ids

    first, first_ids = pick(scores)
    second, second_ids = pick(scores.scatter(-1, first_ids, float("-inf")))
    return torch.cat([first, second], -1), torch.cat([first_ids, second_ids], -1)
