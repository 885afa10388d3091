"""vLLM's hf_overrides: config.json keys replaced before anything reads the model (the loaded
model, max_model_len, the served name, engine-core processes), the checkpoint itself
untouched, bad values refused naming the field."""

from __future__ import annotations

import json
import shutil

import pytest

from compiled_llm import LLM, EngineArgs, SamplingParams
from tests.utils import EXTRA_CONFIGS, hf_greedy, make_checkpoint, random_prompts

EXTRA_CONFIGS.setdefault("qwen3_untied", ("Qwen3Config", {"head_dim": 32,
                                                          "tie_word_embeddings": False}))

OVERRIDES = {"rms_norm_eps": 0.25, "max_position_embeddings": 96}


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


def _overridden_copy(ckpt, tmp_path):
    """The checkpoint with OVERRIDES written into its config.json (transformers' reference)."""
    copy = tmp_path / "edited"
    shutil.copytree(ckpt, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **OVERRIDES}))
    return copy


@pytest.mark.parametrize("core_process", [False, True])
def test_overrides_reach_the_model_as_transformers_reads_them(ckpt, tmp_path, core_process):
    before = (ckpt / "config.json").read_text()
    prompts = random_prompts(3, 300, lo=3, hi=20, seed=6)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with LLM(str(ckpt), enforce_eager=True, dtype="float32", hf_overrides=OVERRIDES,
             engine_core_process=core_process) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        assert llm.engine.model_config.max_model_len == 96
        assert llm.engine.model_config.served_model_name == str(ckpt)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(
        _overridden_copy(ckpt, tmp_path), prompts, 8)
    assert (ckpt / "config.json").read_text() == before  # the checkpoint is left as it was


def test_args_built_again_apply_them_once(ckpt):
    args = EngineArgs(model=str(ckpt), hf_overrides=OVERRIDES)
    again = EngineArgs(**{**vars(args)})
    assert again.model == args.model and again.tokenizer == str(ckpt)


@pytest.mark.parametrize("value", [lambda config: config, ["rms_norm_eps"], "{not json"])
def test_bad_overrides_are_refused_naming_the_field(ckpt, value):
    with pytest.raises(ValueError, match="^hf_overrides"):
        EngineArgs(model=str(ckpt), hf_overrides=value)


@pytest.mark.parametrize("tie", [True, False])
def test_qwen3_reranker_from_its_causal_lm(tmp_path, tie):
    # vLLM's recipe for Qwen3-Reranker: the causal LM served as a one-label classifier whose
    # score is the probability of "yes" against "no" at the last token
    import torch
    import transformers

    ckpt = make_checkpoint("qwen3" if tie else "qwen3_untied")
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    no, yes = sorted(tok.get_vocab(), key=tok.get_vocab().get)[300:302]
    overrides = {"architectures": ["Qwen3ForSequenceClassification"],
                 "classifier_from_token": [no, yes], "is_original_qwen3_reranker": True}
    query, docs = "what is a fox", ["The quick brown fox.", "Tax law of 1998."]
    with LLM(str(ckpt), runner="pooling", enforce_eager=True, dtype="float32",
             hf_overrides=overrides) as llm:
        scores = [out.outputs.score for out in llm.score(query, docs)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = tok.convert_tokens_to_ids([no, yes])
    for doc, score in zip(docs, scores):
        with torch.no_grad():
            logits = hf(**tok(query, doc, return_tensors="pt")).logits[0, -1, ids]
        assert score == pytest.approx(logits.softmax(-1)[1].item(), abs=1e-5)


def test_classifier_from_token_refusals(tmp_path):
    ckpt = make_checkpoint("qwen3")
    base = {"architectures": ["Qwen3ForSequenceClassification"]}
    for extra, field in (({"classifier_from_token": ["a"], "method": "from_2_way_softmax"},
                          "classifier_from_token"),
                         ({"classifier_from_token": ["a", "b"], "method": "softmax"}, "method"),
                         ({"classifier_from_token": ["zz-not-a-token", "a"]},
                          "classifier_from_token")):
        with pytest.raises(ValueError, match=field):
            LLM(str(ckpt), runner="pooling", enforce_eager=True, dtype="float32",
                hf_overrides={**base, **extra})


def test_a_sub_config_takes_the_keys_given_and_other_dicts_are_replaced():
    from compiled_llm.config_fields import merged_config

    config = {"text_config": {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 8},
              "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "vocab_size": 10}
    merged = merged_config(config, {"text_config": {"num_hidden_layers": 2},
                                    "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert merged["text_config"] == {"model_type": "llama", "num_hidden_layers": 2,
                                     "hidden_size": 8}
    assert merged["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}
    assert merged["vocab_size"] == 10 and config["text_config"]["num_hidden_layers"] == 4
