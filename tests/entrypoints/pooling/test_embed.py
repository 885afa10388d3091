"""LLM(runner="pooling").embed against sentence-transformers on all-MiniLM-L6-v2 (the model
directory's mean pooling and Normalize), decoder pooling against transformers' hidden states,
the compiled pooling forward against eager, and the refusals that name runner and the field."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiled_llm import LLM
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import minilm_dir
from tests.utils import make_checkpoint, random_prompts

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Hello world",
             "Embeddings turn sentences into vectors; similar meanings land close together.",
             "Ünïcödé text, 日本語, and emoji 🚀 all tokenize."]


@pytest.fixture(scope="module")
def minilm():
    llm = LLM(str(minilm_dir()), enforce_eager=True)  # runner auto: BertModel pools
    yield llm
    llm.shutdown()


def _vectors(outputs) -> torch.Tensor:
    return torch.tensor([o.outputs.embedding for o in outputs])


def test_minilm_matches_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    ref = st.encode(SENTENCES, convert_to_tensor=True).float()
    outs = minilm.embed(SENTENCES)
    ours = _vectors(outs)
    assert minilm.runner_type == "pooling"
    assert minilm.engine.pooler.pooling_type == "MEAN" and minilm.engine.pooler.normalize
    assert (F.cosine_similarity(ours, ref) >= 0.999).all()
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)
    assert outs[1].outputs.hidden_size == 384 and outs[1].prompt_token_ids[0] == 101  # [CLS]
    # no KV cache anywhere in a pooling run
    assert minilm.engine.num_used_blocks == 0 and minilm.engine.runner.kv_caches == []


def test_overrides_truncation_and_refusals(minilm):
    raw = _vectors(minilm.embed(SENTENCES[:2], PoolingParams(normalize=False)))
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(2))
    short = minilm.embed(SENTENCES[2], truncate_prompt_tokens=4)[0]
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir(), truncation_side="left")
    # cut as a left-truncating tokenizer cuts: [CLS] and [SEP] stay around the text's end
    assert short.prompt_token_ids == tok(SENTENCES[2], truncation=True, max_length=4).input_ids
    assert short.prompt_token_ids[0] == 101 and short.prompt_token_ids[-1] == 102
    with pytest.raises(ValueError, match="max_model_len"):
        minilm.embed("word " * 300)  # sentence_bert_config.json: max_seq_length 256
    with pytest.raises(ValueError, match="^dimensions"):
        minilm.embed("hi", PoolingParams(dimensions=64))
    with pytest.raises(ValueError, match="runner"):
        minilm.generate("hello")
    with pytest.raises(ValueError, match="runner"):
        minilm.classify("hello")
    assert minilm.embed("still serving")[0].outputs.hidden_size == 384


def test_cosine_score(minilm):
    scores = [o.outputs.score for o in minilm.score("A cat sits on the mat.",
                                                     ["A cat is on a mat.", "Stock prices fell."])]
    emb = _vectors(minilm.embed(["A cat sits on the mat.", "A cat is on a mat."]))
    assert scores[0] == pytest.approx(float(emb[0] @ emb[1]), abs=1e-5)
    assert scores[0] > scores[1]
    with pytest.raises(ValueError, match="text_1"):
        minilm.score(["a", "b"], ["c", "d", "e"])


def test_pooling_methods_take_vllms_lora_request_keyword(minilm):
    """vLLM's embed/classify/score/encode take lora_request: None runs as without it, an
    adapter is a ValueError naming it (no LoRA on pooling runs)."""
    from compiled_llm import LoRARequest

    plain = minilm.embed("a text")[0].outputs.embedding
    assert minilm.embed("a text", lora_request=None)[0].outputs.embedding == plain
    assert minilm.encode("a text", lora_request=None)[0].outputs.data.tolist() == plain
    assert len(minilm.score("a", ["b"], lora_request=None)) == 1
    with pytest.raises(ValueError, match="lora_request"):
        minilm.embed("a text", lora_request=LoRARequest("x", 1, "/adapter"))


@pytest.mark.parametrize("name,pooling", [("llama", "LAST"), ("qwen2", "MEAN")])
def test_decoder_pooling_matches_transformers(name, pooling):
    import transformers

    ckpt = make_checkpoint(name)
    prompts = random_prompts(3, 300, lo=3, hi=30, seed=5)
    llm = LLM(str(ckpt), runner="pooling", enforce_eager=True, dtype="float32",
              pooler_config={"pooling_type": pooling, "normalize": False})
    ours = _vectors(llm.embed([{"prompt_token_ids": p} for p in prompts]))
    hf = transformers.AutoModel.from_pretrained(ckpt).eval()
    for row, ids in zip(ours, prompts):
        with torch.no_grad():
            hidden = hf(torch.tensor([ids])).last_hidden_state[0]
        ref = hidden[-1] if pooling == "LAST" else hidden.mean(0)
        torch.testing.assert_close(row, ref, atol=1e-4, rtol=1e-4)
    assert llm.engine.num_used_blocks == 0
    with pytest.raises(ValueError, match="runner"):
        llm.generate([1, 2, 3])
    llm.shutdown()


def test_generate_runner_refuses_pooling_calls():
    llm = LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32",
              skip_tokenizer_init=True, kv_cache_memory_bytes=8 << 20)
    assert llm.runner_type == "generate"
    with pytest.raises(ValueError, match="runner='pooling'"):
        llm.embed([1, 2, 3])
    llm.shutdown()


def test_bad_runner_settings_are_refused():
    model = str(minilm_dir())
    with pytest.raises(ValueError, match="^runner"):
        LLM(model, runner="generate")
    with pytest.raises(ValueError, match="^cudagraph_mode"):
        LLM(model, runner="pooling", cudagraph_mode="piecewise")
    with pytest.raises(ValueError, match="pooler_config.pooling"):
        LLM(model, runner="pooling", pooler_config={"pooling": "MEAN"})
    with pytest.raises(ValueError, match="pooler_config.pooling_type"):
        LLM(model, runner="pooling", pooler_config={"pooling_type": "MAX"})
    with pytest.raises(ValueError, match="pooler_config"):
        LLM(str(make_checkpoint("llama")), runner="generate", pooler_config={"normalize": True})


def test_vllms_task_and_convert_spellings_pick_the_pooling_runner():
    """LLM(..., task="embed") (vLLM's older spelling, still on model cards) and convert="embed"
    embed a generative checkpoint as runner="pooling" does; contradictions name the field."""
    model = str(make_checkpoint("llama"))
    want = None
    for kwargs in ({"runner": "pooling"}, {"task": "embed"}, {"convert": "embed"}):
        llm = LLM(model, enforce_eager=True, dtype="float32", **kwargs)
        assert llm.runner_type == "pooling", kwargs
        got = llm.embed("a short text")[0].outputs.embedding
        want = want or got
        assert got == pytest.approx(want, abs=1e-6), kwargs
        llm.shutdown()
    with pytest.raises(ValueError, match="^task"):
        LLM(model, runner="generate", task="embed")
    with pytest.raises(ValueError, match="^convert"):
        LLM(model, convert="classify")  # no classification head to run


def test_compiled_pooling_forward_matches_eager(minilm, monkeypatch):
    from compiled_llm.compile import counters

    ref = _vectors(minilm.embed(SENTENCES))
    counters.reset()
    monkeypatch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")
    llm = LLM(str(minilm_dir()), runner="pooling", compile_mode="backend")
    ours = _vectors(llm.embed(SENTENCES))
    ours_one = _vectors(llm.embed(SENTENCES[1]))  # another token count: no recompile
    assert counters.graph_breaks == 0 and counters.recompiles == 0
    assert counters.graphs_captured == 1 and counters.pieces == 6 + 1  # split at 6 attentions
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_one, ref[1:2], atol=1e-5, rtol=1e-5)
    llm.shutdown()
