"""llm.llm_engine.model_config answers vLLM's ModelConfig names from the engine's real state
(compared with transformers' config and the engine's args) while the model's DecoderConfig
fields stay reachable; get_model_config, get_num_unfinished_requests and LLM.model_config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers

from compiled_llm import LLM, SamplingParams
from compiled_llm.engine.model_config import ModelConfigView
from tests.utils import make_checkpoint


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("qwen3")  # head_dim 32, not hidden_size // heads (16)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(str(ckpt), enforce_eager=True, dtype="float32", max_model_len=200,
               max_logprobs=7, seed=3)


@pytest.fixture(scope="module")
def hf(ckpt):
    return transformers.AutoConfig.from_pretrained(ckpt)


def test_one_view_everywhere(llm):
    config = llm.llm_engine.model_config
    assert isinstance(config, ModelConfigView)
    assert llm.model_config is config
    assert llm.llm_engine.get_model_config() is config


def test_vllm_fields_from_the_engine(llm, ckpt):
    config = llm.llm_engine.model_config
    assert config.max_model_len == 200 == llm.llm_engine.max_model_len
    assert isinstance(config.max_model_len, int)
    assert config.dtype is torch.float32 and isinstance(config.dtype, torch.dtype)
    assert config.model == str(ckpt) == config.tokenizer == config.served_model_name
    assert config.max_logprobs == 7
    assert config.seed == 3
    assert config.runner_type == "generate"
    assert config.enforce_eager is True
    assert config.skip_tokenizer_init is False
    assert config.quantization is None and not config.is_quantized()
    assert config.override_generation_config == {}
    assert config.get_diff_sampling_param() == llm.llm_engine.sampling_defaults
    assert not config.is_multimodal_model and not config.is_encoder_decoder


def test_vllm_getters_match_transformers(llm, hf):
    config = llm.llm_engine.model_config
    assert isinstance(config.hf_config, transformers.PretrainedConfig)
    assert config.hf_config.to_dict() == hf.to_dict()
    assert config.hf_text_config.to_dict() == hf.get_text_config().to_dict()
    assert config.architectures == hf.architectures == ["Qwen3ForCausalLM"]
    assert config.get_vocab_size() == hf.vocab_size
    assert config.get_hidden_size() == hf.hidden_size == config.hidden_size
    assert config.get_head_size() == hf.head_dim == 32
    assert config.get_total_num_hidden_layers() == hf.num_hidden_layers == 2
    assert config.get_num_layers() == hf.num_hidden_layers
    assert config.get_total_num_kv_heads() == hf.num_key_value_heads == 2
    assert config.get_num_kv_heads() == 2
    assert config.get_num_attention_heads() == hf.num_attention_heads
    assert config.get_sliding_window() == getattr(hf, "sliding_window", None)
    assert config.get_num_experts() == 0 and not config.is_model_moe()


def test_getters_take_a_parallel_config(llm):
    config = llm.llm_engine.model_config
    pp2 = dict(tensor_parallel_size=1, pipeline_parallel_size=2)
    assert config.get_num_layers(SimpleNamespace(**pp2, rank=0)) == 1
    assert config.get_layers_start_end_indices(SimpleNamespace(**pp2, rank=1)) == (1, 2)
    tp4 = SimpleNamespace(tensor_parallel_size=4, pipeline_parallel_size=1)
    assert config.get_num_kv_heads(tp4) == 1  # 2 KV heads over 4 ranks: replicated
    assert config.get_num_attention_heads(tp4) == 1


def test_decoder_config_fields_still_reachable(llm, hf):
    config = llm.llm_engine.model_config
    decoder = llm.llm_engine.core.info.model_config
    assert config.vocab_size == decoder.vocab_size == hf.vocab_size
    assert config.num_hidden_layers == decoder.num_hidden_layers == hf.num_hidden_layers
    assert config.num_key_value_heads == hf.num_key_value_heads
    assert config.head_dim == 32 and config.intermediate_size == hf.intermediate_size
    assert config.tie_word_embeddings is True and config.moe is None
    assert config.architecture == "Qwen3ForCausalLM"
    assert llm.engine.model_config.vocab_size == hf.vocab_size  # the spelling tests use
    assert {"vocab_size", "max_model_len", "get_vocab_size"} <= set(dir(config))


def test_read_only(llm):
    config = llm.llm_engine.model_config
    for name in ("max_model_len", "vocab_size", "brand_new"):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(config, name, 1)
    with pytest.raises(AttributeError, match="no attribute 'no_such_field'"):
        _ = config.no_such_field
    assert config.max_model_len == 200


def test_num_unfinished_requests_counts_sequences(llm):
    engine = llm.llm_engine
    assert engine.get_num_unfinished_requests() == 0
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request("one", {"prompt_token_ids": [5, 6, 7]}, params)
    engine.add_request("three", {"prompt_token_ids": [8, 9]},
                       SamplingParams(n=3, temperature=1.0, max_tokens=5, ignore_eos=True))
    assert engine.get_num_unfinished_requests() == 4  # vLLM v1 counts n > 1's children
    counts = []
    while engine.has_unfinished_requests():
        engine.step()
        counts.append(engine.get_num_unfinished_requests())
    assert counts[-1] == 0 and 3 in counts  # "one" finished before "three"'s sequences
    assert counts == sorted(counts, reverse=True)


def test_pooling_engine_has_the_view():
    from tests.entrypoints.pooling.checkpoints import bert_classifier

    ckpt = bert_classifier(3)
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    hf = transformers.AutoConfig.from_pretrained(ckpt)
    config = llm.llm_engine.model_config
    assert llm.model_config is config is llm.llm_engine.get_model_config()
    assert config.runner_type == "pooling" and config.dtype is torch.float32
    assert config.max_model_len == llm.llm_engine.max_model_len
    assert config.get_vocab_size() == hf.vocab_size == config.vocab_size
    assert config.get_head_size() == hf.hidden_size // hf.num_attention_heads
    assert config.num_labels == 3 == llm.llm_engine.num_labels
    assert llm.llm_engine.get_num_unfinished_requests() == 0
