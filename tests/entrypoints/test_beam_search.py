"""LLM.beam_search (vLLM's algorithm): one beam is greedy decoding; wider beams equal the same
search run on transformers' log-probabilities; scores, texts and refusals; the pool empty."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.entrypoints.beam_search import beam_score
from compiled_llm.sampling_params import BeamSearchParams
from tests.utils import make_checkpoint, random_prompts


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(str(ckpt), enforce_eager=True, dtype="float32")


def _hf_beams(ckpt, prompt: list[int], width: int, steps: int) -> list[tuple[list[int], float]]:
    """The same search on transformers' log-softmax (no EOS: every beam runs to the end)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    beams = [(list(prompt), 0.0)]
    for _ in range(steps):
        children = []
        for tokens, score in beams:
            with torch.no_grad():
                row = model(torch.tensor([tokens])).logits[0, -1].float().log_softmax(-1)
            top = row.topk(2 * width)
            children += [(tokens + [t], score + lp) for lp, t in zip(top.values.tolist(),
                                                                       top.indices.tolist())]
        children.sort(key=lambda child: child[1] / len(child[0]), reverse=True)
        beams = children[:width]
    return beams


def test_one_beam_is_greedy(llm):
    prompts = random_prompts(3, 300, lo=4, hi=20, seed=5)
    greedy = llm.generate([{"prompt_token_ids": p} for p in prompts],
                          SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                          use_tqdm=False)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))
    for prompt, out, ref in zip(prompts, outs, greedy):
        (beam,) = out.sequences
        assert beam.tokens == prompt + list(ref.outputs[0].token_ids)
        assert beam.finish_reason == "length"
    assert llm.engine.num_used_blocks == 0


def test_wider_beams_equal_the_search_on_transformers(llm, ckpt):
    prompt = random_prompts(1, 300, lo=6, hi=7, seed=8)[0]
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=4,
                                                        ignore_eos=True))
    ref = _hf_beams(ckpt, prompt, 3, 4)
    assert [beam.tokens for beam in out.sequences] == [tokens for tokens, _ in ref]
    for beam, (_, score) in zip(out.sequences, ref):
        assert beam.cum_logprob == pytest.approx(score, abs=1e-4)
        assert len(beam.logprobs) == 4 and beam.text == llm.get_tokenizer().decode(beam.tokens)
    scores = [beam_score(beam, None, 1.0) for beam in out.sequences]
    assert scores == sorted(scores, reverse=True)


def test_text_prompts_and_refusals(llm):
    (out,) = llm.beam_search([{"prompt": "The quick brown"}],
                             BeamSearchParams(beam_width=2, max_tokens=3))
    assert len(out.sequences) == 2 and out.sequences[0].text.startswith("The quick brown")
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=3)
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search(["hi"], SamplingParams(max_tokens=3))
    assert llm.engine.num_used_blocks == 0


def test_beams_end_at_max_model_len(ckpt):
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32", max_model_len=12)
    (out,) = llm.beam_search([list(range(5, 13))], BeamSearchParams(beam_width=2, max_tokens=10,
                                                                    ignore_eos=True))
    assert [len(beam.tokens) for beam in out.sequences] == [12, 12]
    assert {beam.finish_reason for beam in out.sequences} == {"length"}
    assert llm.engine.num_used_blocks == 0
