"""Sampler: greedy/random paths, truncation, penalties, seeding, bans and logprobs (CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from compiled_llm.sample.sampler import (
    Sampler,
    SamplingMetadata,
    apply_penalties,
    apply_top_k_top_p,
    compute_prompt_logprobs,
    make_generator,
    token_counts,
)

V = 32


def make_meta(batch: int, **kw) -> SamplingMetadata:
    """Metadata with everything off; per-row lists/values given in kw are tensorised (prompt
    and output token lists become the [B, V] counts and prompt mask penalties read)."""
    temp = torch.tensor(kw.pop("temperature", [1.0] * batch), dtype=torch.float32)
    tensors = {}
    for name, dtype in [("top_k", torch.int64), ("top_p", torch.float32), ("min_p", torch.float32)]:
        vals = kw.pop(name, None)
        tensors[name] = None if vals is None else torch.tensor(vals, dtype=dtype)
    pens = {}
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        vals = kw.pop(name, None)
        pens[name] = None if vals is None else torch.tensor(vals, dtype=torch.float32)
    prompts = kw.pop("prompt_token_ids", [[] for _ in range(batch)])
    outputs = kw.pop("output_token_ids", [[] for _ in range(batch)])
    vocab = kw.pop("vocab", V)
    if pens["presence_penalty"] is not None:
        pens["output_counts"] = token_counts(outputs, vocab, torch.device("cpu"))
        if (pens["repetition_penalty"] != 1.0).any():
            pens["prompt_mask"] = token_counts(prompts, vocab, torch.device("cpu")) > 0
    meta = SamplingMetadata(
        temperature=temp,
        all_greedy=bool((temp == 0).all()),
        generators=kw.pop("generators", {}),
        output_token_ids=outputs,
        banned_token_ids=kw.pop("banned_token_ids", {}),
        logits_processors=kw.pop("logits_processors", {}),
        max_num_logprobs=kw.pop("max_num_logprobs", None),
        grammar_bitmask=kw.pop("grammar_bitmask", None),
        grammar_rows=kw.pop("grammar_rows", []),
        **tensors,
        **pens,
    )
    assert not kw, kw
    return meta


def logits_batch(batch: int, seed: int = 0, vocab: int = V) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * 3


def sample(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    return Sampler()(logits, meta).sampled_token_ids


def test_all_greedy_is_argmax_and_input_untouched():
    logits = logits_batch(8)
    before = logits.clone()
    out = Sampler()(logits, make_meta(8, temperature=[0.0] * 8))
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.sampled_token_ids.dtype == torch.int64 and out.logprobs is None
    assert torch.equal(logits, before)


def test_mixed_batch_greedy_rows_are_argmax():
    torch.manual_seed(0)
    logits = logits_batch(16)
    temps = [0.0 if i % 2 else 2.0 for i in range(16)]
    meta = make_meta(16, temperature=temps, top_k=[0, 5] * 8, top_p=[0.9] * 16)
    for _ in range(5):
        out = sample(logits, meta)
        assert torch.equal(out[1::2], logits.argmax(-1)[1::2])


@pytest.mark.parametrize("temp", [0.3, 1.0, 7.0, 100.0])
def test_top_k_one_is_greedy(temp):
    torch.manual_seed(1)
    logits = logits_batch(64)
    meta = make_meta(64, temperature=[temp] * 64, top_k=[1] * 64)
    assert torch.equal(sample(logits, meta), logits.argmax(-1))
    meta = make_meta(64, temperature=[temp] * 64, top_k=[1] * 64, top_p=[0.95] * 64)
    assert torch.equal(sample(logits, meta), logits.argmax(-1))


def test_tiny_top_p_is_argmax():
    torch.manual_seed(2)
    logits = logits_batch(64)
    meta = make_meta(64, temperature=[1.5] * 64, top_p=[1e-6] * 64)
    assert torch.equal(sample(logits, meta), logits.argmax(-1))


def test_low_temperature_limit_is_argmax():
    torch.manual_seed(3)
    logits = logits_batch(64)
    meta = make_meta(64, temperature=[1e-3] * 64)
    assert torch.equal(sample(logits, meta), logits.argmax(-1))


def test_min_p_filters_unlikely_tokens():
    torch.manual_seed(4)
    probs = torch.tensor([0.5, 0.3, 0.12, 0.05, 0.03])
    logits = probs.log().expand(4000, -1).contiguous()
    meta = make_meta(4000, min_p=[0.2] * 4000)  # threshold 0.1: tokens 3, 4 go
    out = sample(logits, meta)
    assert set(out.tolist()) == {0, 1, 2}
    freq = torch.bincount(out, minlength=5).float() / 4000
    assert torch.allclose(freq[:3], probs[:3] / probs[:3].sum(), atol=0.03)


def test_banned_ids_never_sampled():
    torch.manual_seed(5)
    logits = logits_batch(256)
    logits[:, :3] = 50.0  # the banned ids would otherwise always win
    banned = {r: [0, 1, 2] for r in range(0, 256, 2)}
    meta = make_meta(256, temperature=[0.0, 1.0] * 128, banned_token_ids=banned)
    out = sample(logits, meta)
    assert not (out[::2, None] == torch.tensor([0, 1, 2])).any()
    assert (out[1::2] < 3).all()


def test_grammar_bitmask_restricts_only_its_rows():
    torch.manual_seed(6)
    logits = logits_batch(128)
    bitmask = torch.full((128, -(-V // 32)), -1, dtype=torch.int32)  # all allowed
    bitmask[::2] = 0
    bitmask[::2, 0] = (1 << 7) | (1 << 9)  # even rows: only tokens 7 and 9
    meta = make_meta(128, temperature=[5.0] * 128, grammar_bitmask=bitmask,
                     grammar_rows=list(range(0, 128, 2)))
    out = sample(logits, meta)
    assert set(out[::2].tolist()) <= {7, 9}
    assert len(set(out[1::2].tolist()) - {7, 9}) > 10


def test_logits_processor_bans_token_and_sees_output_ids():
    seen = []

    def ban_top(output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
        seen.append(list(output_ids))
        row = row.clone()  # returning a fresh tensor must work too
        row[row.argmax()] = float("-inf")
        return row

    logits = logits_batch(4)
    outs = [[1, 2], [3], [], [4]]
    meta = make_meta(
        4, temperature=[0.0] * 4, output_token_ids=outs, logits_processors={2: [ban_top]}
    )
    out = sample(logits, meta)
    assert seen == [[]]
    assert out[2] == logits[2].topk(2).indices[1]
    assert torch.equal(out[[0, 1, 3]], logits.argmax(-1)[[0, 1, 3]])


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a token of zero probability"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize(
    "temp,top_k,top_p", [(0.7, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.8), (1.0, 4, 0.7)]
)
def test_distribution_matches_softmax(temp, top_k, top_p):
    torch.manual_seed(7)
    vocab, n = 8, 20000
    row = torch.tensor([1.0, 0.5, 0.2, 0.0, -0.3, -0.5, -1.0, -2.0])
    probs = torch.softmax(row.double() / temp, -1)
    order = probs.argsort(descending=True)
    keep = torch.zeros(vocab, dtype=torch.bool)
    keep[order[: top_k or vocab]] = True
    p = probs * keep
    p /= p.sum()
    before = torch.cumsum(p[order], 0) - p[order]  # mass strictly above each token
    keep[order[before >= top_p]] = False
    expected = probs * keep
    expected /= expected.sum()
    meta = make_meta(n, temperature=[temp] * n, top_k=[top_k] * n, top_p=[top_p] * n)
    counts = torch.bincount(sample(row.expand(n, -1).contiguous(), meta), minlength=vocab)
    df = int(keep.sum()) - 1
    assert _chi_square(counts.double(), expected) < df + 6 * math.sqrt(2 * df) + 1


def test_seeded_rows_draw_distribution():
    # Many independent seeds should still sample from the right distribution.
    row = torch.tensor([2.0, 1.0, 0.0, -1.0])
    n = 4000
    gens = {i: make_generator(1000 + i, "cpu") for i in range(n)}
    counts = torch.bincount(sample(row.expand(n, -1).contiguous(), make_meta(n, generators=gens)))
    assert _chi_square(counts.double(), torch.softmax(row.double(), -1)) < 20


def test_seeded_row_independent_of_batch():
    steps, batch, target = 25, 16, 5
    params = dict(temperature=0.9, top_k=12, top_p=0.95, min_p=0.01)
    params.update(presence_penalty=0.5, frequency_penalty=0.2, repetition_penalty=1.1)

    def run(batched: bool) -> list[int]:
        gen = make_generator(1234, "cpu")
        other_gens = {r: make_generator(r, "cpu") for r in (0, 9)}
        tokens: list[int] = []
        history = [[] for _ in range(batch)]
        for step in range(steps):
            logits = logits_batch(batch, seed=100 + step, vocab=64)
            rows = {k: [float(i % 3) * 0.4 + 0.3 for i in range(batch)] for k in params}
            rows["top_k"] = [i % 4 * 5 for i in range(batch)]
            rows["top_p"] = [1.0 - i % 3 * 0.2 for i in range(batch)]
            for k, v in params.items():
                rows[k][target] = v
            prompts = [[1, 2, 3 + i] for i in range(batch)]
            if batched:
                meta = make_meta(
                    batch,
                    vocab=64,
                    generators={target: gen, **other_gens},
                    prompt_token_ids=prompts,
                    output_token_ids=history,
                    **rows,
                )
                step_tokens = sample(logits, meta).tolist()
            else:
                solo = {k: [v] for k, v in params.items()}
                meta = make_meta(
                    1,
                    vocab=64,
                    generators={0: gen},
                    prompt_token_ids=[prompts[target]],
                    output_token_ids=[history[target]],
                    **solo,
                )
                step_tokens = [0] * batch
                step_tokens[target] = int(sample(logits[target : target + 1], meta)[0])
            tokens.append(step_tokens[target])
            for r, t in enumerate(step_tokens):
                history[r].append(t)
        return tokens

    solo = run(batched=False)
    assert run(batched=True) == solo
    assert len(set(solo)) > 3  # it really sampled rather than collapsing to argmax


def _ref_penalties(logits, prompts, outputs, pres, freq, rep):
    out = logits.clone().double()
    for r in range(out.shape[0]):
        for t in set(prompts[r]) | set(outputs[r]):
            x = out[r, t]
            out[r, t] = x / rep[r] if x > 0 else x * rep[r]
        for t in set(outputs[r]):
            c = outputs[r].count(t)
            out[r, t] -= freq[r] * c + pres[r]
    return out


def test_penalties_match_reference():
    g = torch.Generator().manual_seed(8)
    batch = 6
    logits = torch.randn(batch, V, generator=g) * 4
    prompts = [torch.randint(0, V, (int(n),), generator=g).tolist() for n in [0, 3, 10, 1, 7, 20]]
    outputs = [torch.randint(0, V, (int(n),), generator=g).tolist() for n in [5, 0, 12, 2, 30, 1]]
    pres = [0.0, 0.5, -1.0, 2.0, 0.3, 0.0]
    freq = [0.1, 0.0, 0.7, -0.5, 1.5, 0.0]
    rep = [1.0, 1.3, 0.8, 2.0, 1.0, 1.1]
    meta = make_meta(
        batch,
        prompt_token_ids=prompts,
        output_token_ids=outputs,
        presence_penalty=pres,
        frequency_penalty=freq,
        repetition_penalty=rep,
    )
    got = apply_penalties(logits.clone(), meta)
    want = _ref_penalties(logits, prompts, outputs, pres, freq, rep)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    greedy = make_meta(
        batch,
        temperature=[0.0] * batch,
        prompt_token_ids=prompts,
        output_token_ids=outputs,
        presence_penalty=pres,
        frequency_penalty=freq,
        repetition_penalty=rep,
    )
    assert torch.equal(sample(logits, greedy), want.argmax(-1))


def _ref_top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """Tie-inclusive reference: keep a token iff it survives by value, not by sort position."""
    x = logits.double()
    if k:
        x = x.masked_fill(x < x.sort(descending=True).values[min(k, len(x)) - 1], -math.inf)
    probs = torch.softmax(x, -1)
    above = torch.stack([probs[probs > q].sum() for q in probs])
    return x.masked_fill(above >= p, -math.inf)


def test_top_k_top_p_with_ties_hand_checked():
    row = torch.tensor([[3.0, 3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    keep = lambda out: torch.isfinite(out[0]).nonzero().flatten().tolist()  # noqa: E731
    for k, want in [(1, [0, 1]), (2, [0, 1]), (3, [0, 1, 2, 3, 4]), (6, [0, 1, 2, 3, 4, 5])]:
        out = row.clone()
        apply_top_k_top_p(out, torch.tensor([k]), None)
        assert keep(out) == want
        out = row.clone()
        apply_top_k_top_p(out, torch.tensor([k]), torch.tensor([1.0]))
        assert keep(out) == want
    out = row.clone()  # tied pair at the top holds ~0.61 of the mass
    apply_top_k_top_p(out, None, torch.tensor([0.3]))
    assert keep(out) == [0, 1]
    out = row.clone()
    apply_top_k_top_p(out, torch.tensor([0]), torch.tensor([0.65]))
    assert keep(out) == [0, 1, 2, 3, 4]


def test_top_k_top_p_random_vs_reference():
    g = torch.Generator().manual_seed(9)
    batch = 64
    logits = torch.randint(-3, 4, (batch, V), generator=g).float()  # many ties
    logits[::2] += torch.randn(batch // 2, V, generator=g)
    ks = torch.randint(0, V + 5, (batch,), generator=g)
    ps = torch.rand(batch, generator=g).clamp(min=0.05)
    ps[::3] = 1.0
    for k_arg, p_arg in [(ks, ps), (ks, None), (None, ps)]:
        out = logits.clone()
        apply_top_k_top_p(out, k_arg, p_arg)
        for r in range(batch):
            ref = _ref_top_k_top_p(
                logits[r],
                int(ks[r]) if k_arg is not None else 0,
                float(ps[r]) if p_arg is not None else 1.0,
            )
            assert torch.equal(torch.isfinite(out[r]), torch.isfinite(ref)), r


def test_logprobs_are_raw_and_ranked():
    torch.manual_seed(10)
    logits = logits_batch(32)
    logits[0, :4] = 9.0  # ties among the top tokens
    meta = make_meta(
        32,
        temperature=[2.0] * 16 + [0.0] * 16,
        top_k=[3] * 32,
        presence_penalty=[1.0] * 32,
        frequency_penalty=[0.0] * 32,
        repetition_penalty=[1.5] * 32,
        output_token_ids=[[1, 1, 2]] * 32,
        prompt_token_ids=[[5]] * 32,
        max_num_logprobs=4,
    )
    out = Sampler()(logits, meta)
    lp = out.logprobs
    raw = torch.log_softmax(logits.float(), -1)
    tok = out.sampled_token_ids
    assert lp.token_ids.shape == (32, 5) and lp.logprobs.shape == (32, 5)
    assert torch.equal(lp.token_ids[:, 0], tok)
    torch.testing.assert_close(lp.logprobs[:, 0], raw.gather(1, tok[:, None])[:, 0])
    want_ranks = [int((raw[r] >= raw[r, tok[r]]).sum()) for r in range(32)]
    assert lp.ranks.tolist() == want_ranks
    top = raw.topk(4, -1)
    torch.testing.assert_close(lp.logprobs[:, 1:], top.values)
    assert torch.equal(raw.gather(1, lp.token_ids[:, 1:]), top.values)
    assert lp.ranks[0] == 4 and lp.ranks.min() >= 1
    ids, vals, ranks = lp.tolists()
    assert len(ids) == 32 and len(vals[0]) == 5 and ranks == want_ranks


def test_zero_logprobs_gives_only_sampled_column():
    logits = logits_batch(3)
    out = Sampler()(logits, make_meta(3, temperature=[0.0] * 3, max_num_logprobs=0))
    assert out.logprobs.token_ids.shape == (3, 1)
    assert out.logprobs.ranks.tolist() == [1, 1, 1]


def test_prompt_logprobs():
    logits = logits_batch(10).to(torch.bfloat16)
    targets = torch.arange(10)
    lp = compute_prompt_logprobs(logits, targets, 3)
    raw = torch.log_softmax(logits.float(), -1)
    assert lp.token_ids.shape == (10, 4) and lp.logprobs.dtype == torch.float32
    assert torch.equal(lp.token_ids[:, 0], targets)
    torch.testing.assert_close(lp.logprobs[:, 0], raw[torch.arange(10), targets])
    assert lp.ranks.tolist() == [int((raw[i] >= raw[i, i]).sum()) for i in range(10)]
    torch.testing.assert_close(lp.logprobs[:, 1:], raw.topk(3, -1).values)


def test_an_all_greedy_batch_builds_no_sampling_tensors():
    from compiled_llm.core.request import Request
    from compiled_llm.sample.metadata import build_sampling_metadata
    from compiled_llm.sample.state import SamplingState
    from compiled_llm.sampling_params import SamplingParams

    def reqs(*params):
        return [Request(str(i), [1, 2], p) for i, p in enumerate(params)]

    made = []
    gen_for = lambda r: made.append(r) or None  # noqa: E731
    greedy = SamplingParams(temperature=0.0, seed=3, top_k=5)
    state = SamplingState(torch.device("cpu"), V)
    meta = build_sampling_metadata(reqs(greedy, greedy), state, gen_for)
    assert meta.all_greedy and meta.temperature is None and meta.top_k is None
    assert meta.presence_penalty is None and not made and not meta.edits_logits
    assert state.num_live == 0  # an all-greedy batch needs no slot
    mixed = build_sampling_metadata(
        reqs(greedy, SamplingParams(temperature=0.7, top_k=9, repetition_penalty=1.2)),
        state, gen_for)
    assert mixed.temperature.tolist() == pytest.approx([0.0, 0.7])
    assert mixed.max_top_k == 9 and mixed.any_repetition_penalty and len(made) == 2
    assert mixed.prompt_mask.nonzero().tolist() == [[1, 1], [1, 2]]  # row 0 has none
    assert mixed.penalty_rows.tolist()[0] == 0 and state.num_live == 2


def test_the_sampler_prepares_and_releases_its_own_request_state():
    """From requests alone: a seeded request keeps one generator across steps (a stream of
    draws), released with the request; a re-admitted seed replays the same stream."""
    from compiled_llm.core.request import Request
    from compiled_llm.sampling_params import SamplingParams

    sampler = Sampler("cpu", vocab_size=V)
    logits = torch.zeros(2, V)  # uniform: every draw comes from the generator alone
    reqs = [Request("seeded", [1, 2], SamplingParams(temperature=1.0, seed=7)),
            Request("free", [1, 2], SamplingParams(temperature=1.0))]

    def draws() -> list[int]:
        return [int(sampler(logits, sampler.prepare(reqs)).sampled_token_ids[0])
                for _ in range(6)]

    first = draws()
    assert set(sampler.generators) == {"seeded"} and len(set(first)) > 1
    sampler.release({"seeded", "unknown"})
    assert not sampler.generators
    assert draws() == first
