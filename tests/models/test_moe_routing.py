"""The router variants against straightforward per-token torch: softmax top-k (renormalised or
not), sigmoid with a correction bias (DeepSeek-V3), grouped top-k with and without the bias."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.models.moe_routing import grouped_topk, sigmoid_topk, softmax_topk

NUM_TOKENS, NUM_EXPERTS = 6, 16


def _logits(dtype=torch.float32):
    gen = torch.Generator().manual_seed(3)
    return torch.randn(NUM_TOKENS, NUM_EXPERTS, generator=gen).to(dtype)


def _by_token(weights, ids):
    """Per token, {expert: weight}: the order of the top-k slots does not matter."""
    return [dict(zip(i.tolist(), w.tolist())) for w, i in zip(weights, ids)]


def _plain(logits, top_k, scoring, bias=None, groups=1, topk_group=1, renormalize=False,
           scale=1.0):
    """One token at a time: score, pick the best groups, pick the experts, weigh them."""
    out = []
    size = NUM_EXPERTS // groups
    for row in logits.float():
        scores = row.softmax(-1) if scoring == "softmax" else row.sigmoid()
        choice = scores if bias is None else scores + bias
        group_scores = []
        for group in range(groups):
            members = sorted(choice[group * size:(group + 1) * size].tolist(), reverse=True)
            group_scores.append(sum(members[:2]) if bias is not None else members[0])
        best = sorted(range(groups), key=group_scores.__getitem__, reverse=True)[:topk_group]
        allowed = [e for e in range(NUM_EXPERTS) if e // size in best]
        picked = sorted(allowed, key=lambda e: float(choice[e]), reverse=True)[:top_k]
        total = sum(float(scores[e]) for e in picked) if renormalize else 1.0
        out.append({e: float(scores[e]) / total * scale for e in picked})
    return out


def _assert_same(got, expected):
    assert [set(g) for g in got] == [set(e) for e in expected]
    for g, e in zip(got, expected):
        for expert in g:
            assert g[expert] == pytest.approx(e[expert], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_topk(renormalize, dtype):
    weights, ids = softmax_topk(_logits(dtype), 4, renormalize)
    assert weights.dtype == torch.float32 and ids.shape == (NUM_TOKENS, 4)
    _assert_same(_by_token(weights, ids), _plain(_logits(dtype), 4, "softmax",
                                                 renormalize=renormalize))
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(NUM_TOKENS))


def test_sigmoid_topk_with_correction_bias_selects_by_bias_weighs_without():
    bias = torch.linspace(-0.5, 0.5, NUM_EXPERTS)
    weights, ids = sigmoid_topk(_logits(), 3, bias, renormalize=True, routed_scaling_factor=2.5)
    expected = _plain(_logits(), 3, "sigmoid", bias=bias, renormalize=True, scale=2.5)
    _assert_same(_by_token(weights, ids), expected)
    plain_weights, plain_ids = sigmoid_topk(_logits(), 3, None, renormalize=False)
    _assert_same(_by_token(plain_weights, plain_ids), _plain(_logits(), 3, "sigmoid"))
    assert not torch.equal(ids.sort(-1).values, plain_ids.sort(-1).values)  # the bias mattered


@pytest.mark.parametrize("scoring,biased", [("softmax", False), ("sigmoid", True),
                                            ("sigmoid", False)])
def test_grouped_topk(scoring, biased):
    bias = torch.linspace(0.3, -0.3, NUM_EXPERTS) if biased else None
    weights, ids = grouped_topk(_logits(), 3, 4, 2, renormalize=biased, scoring_func=scoring,
                                correction_bias=bias)
    expected = _plain(_logits(), 3, scoring, bias=bias, groups=4, topk_group=2,
                      renormalize=biased)
    _assert_same(_by_token(weights, ids), expected)
    for row in ids:  # the experts come from at most topk_group groups
        assert len({int(e) // 4 for e in row}) <= 2


def test_grouped_topk_bad_groups_and_scoring_raise():
    with pytest.raises(ValueError, match="groups"):
        grouped_topk(_logits(), 2, 5, 2, renormalize=False)
    with pytest.raises(ValueError, match="scoring_func"):
        grouped_topk(_logits(), 2, 4, 2, renormalize=False, scoring_func="relu")


def test_routing_compiles_fullgraph_with_dynamic_tokens():
    bias = torch.linspace(-0.5, 0.5, NUM_EXPERTS)

    def route(logits):
        return grouped_topk(logits, 3, 4, 2, True, "sigmoid", bias, 2.5)

    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    for num_tokens in (2, 9):
        logits = torch.randn(num_tokens, NUM_EXPERTS)
        _assert_same(_by_token(*compiled(logits)), _by_token(*route(logits)))


def test_saturated_top_k_is_guarded_as_the_models_guard_it():
    """A router whose chosen scores underflow to 0 (a saturated sigmoid or softmax): the
    renormalised weights divide by sum + 1e-20 (DeepSeek-V3, GLM-4.5) or by the sum floored at
    moe_norm_min (ERNIE 4.5), not by 0: no NaN reaches the experts."""
    logits = torch.full((2, NUM_EXPERTS), -200.0)
    logits[1, :4] = torch.tensor([-100.0, -101.0, -102.0, -103.0])
    plain, _ = grouped_topk(logits, 2, 1, 1, True, "sigmoid")
    assert plain.isnan().any()  # the unguarded division this test is about
    weights, _ = grouped_topk(logits, 2, 1, 1, True, "sigmoid", renorm_eps=1e-20)
    scores = logits.sigmoid().topk(2, dim=-1).values
    torch.testing.assert_close(weights, scores / (scores.sum(-1, keepdim=True) + 1e-20))
    softmax_logits = torch.cat([torch.full((2, 1), 60.0), torch.zeros(2, NUM_EXPERTS - 1)], 1)
    bias = torch.zeros(NUM_EXPERTS)
    bias[1:3] = 5.0  # the bias picks two experts whose probabilities are ~1e-26
    weights, ids = grouped_topk(softmax_logits, 2, 1, 1, True, "softmax", bias,
                                renorm_floor=1e-12)
    probs = softmax_logits.softmax(-1).gather(1, ids)
    assert sorted(ids[0].tolist()) == [1, 2]
    torch.testing.assert_close(weights, probs / 1e-12)
    assert not weights.isnan().any()
