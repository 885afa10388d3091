"""The speculative-decoding benchmark's quoting workload: on the peaked checkpoint the greedy
answer really quotes the prompt's walk, and n-gram lookup accepts its drafts (so the GPU
figure measures n-gram at a real copying answer's acceptance)."""

from __future__ import annotations

from benchmarks.spec_decode import SHAPES, peaked_checkpoint, quoting
from compiled_llm import LLM, SamplingParams


def _answer(model: str, prompt: list[int], spec: dict | None) -> tuple[list[int], dict]:
    with LLM(model=model, dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
             engine_core_process=False, speculative_config=spec) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                detokenize=False)
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        metrics = {m.name: m.value for m in llm.get_metrics() if "spec_decode" in m.name}
        return list(out[0].outputs[0].token_ids), metrics


def test_the_peaked_checkpoint_quotes_the_walk(tmp_path):
    model = peaked_checkpoint("cpu-small", str(tmp_path))
    prompt = quoting(48, SHAPES["cpu-small"]["vocab_size"], filler=8)[0]
    plain, _ = _answer(model, prompt, None)
    assert plain == prompt[1:13]  # the walk again, from its second token
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
             "prompt_lookup_min": 2}
    spec, metrics = _answer(model, prompt, ngram)
    assert spec == plain
    assert metrics["vllm:spec_decode_num_accepted_tokens"] >= 6
