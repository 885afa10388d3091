"""What a vLLM user's pooling code passes, taken as vLLM takes it: a model saved by the installed
sentence-transformers (its pooling_mode config, its Dense modules), PoolingParams'
softmax/activation/task spellings, LLM.reward and encode's pooling_task, compiled_llm.inputs,
and bad prompt types as ValueErrors naming the argument."""

from __future__ import annotations

import json

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.pooling_params import PoolingParams
from compiled_llm.worker.pooler import sentence_transformers_pooler
from tests.entrypoints.pooling.checkpoints import bert_classifier, st_bert

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "a", "x " * 40]


@pytest.mark.parametrize("mode", ["mean", "lasttoken"])
def test_sentence_transformers_pooling_mode_matches_its_encode(mode):
    """sentence-transformers >= 6 saves "pooling_mode": "mean"; it was read as no pooling
    module, so the model pooled CLS instead."""
    from sentence_transformers import SentenceTransformer

    model = st_bert(mode)
    ref = SentenceTransformer(str(model), device="cpu").encode(TEXTS, convert_to_tensor=True)
    llm = LLM(str(model), enforce_eager=True, dtype="float32")
    ours = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    llm.shutdown()
    torch.testing.assert_close(ours, ref.float(), atol=1e-5, rtol=1e-5)


def test_sentence_transformers_dense_modules_run_before_normalize():
    """LaBSE-style Dense projections (tanh) after the pooling: they were skipped silently."""
    from sentence_transformers import SentenceTransformer

    model = st_bert("cls", dense=(48, 32))
    ref = SentenceTransformer(str(model), device="cpu").encode(TEXTS, convert_to_tensor=True)
    llm = LLM(str(model), enforce_eager=True, dtype="float32")
    outs = llm.embed(TEXTS, use_tqdm=False)
    ours = torch.tensor([o.outputs.embedding for o in outs])
    torch.testing.assert_close(ours, ref.float(), atol=1e-5, rtol=1e-5)
    assert outs[0].outputs.hidden_size == 32
    llm.shutdown()


def test_sentence_transformers_modules_not_implemented_are_refused():
    with pytest.raises(ValueError, match="LayerNorm.*not supported"):
        LLM(str(st_bert("mean", extra="LayerNorm")), enforce_eager=True, dtype="float32")


def test_sentence_transformers_pooling_mode_spellings(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    config = tmp_path / "1_Pooling" / "config.json"
    for value, want in (("cls", "CLS"), (["mean"], "MEAN"), ("lasttoken", "LAST")):
        config.write_text(json.dumps({"pooling_mode": value}))
        assert sentence_transformers_pooler(tmp_path).pooling_type == want
    config.write_text(json.dumps({"pooling_mode": "max"}))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        sentence_transformers_pooler(tmp_path)


def test_pooling_params_take_vllms_activation_spellings():
    assert PoolingParams().use_activation is True
    assert PoolingParams(use_activation=None).use_activation is True  # vLLM's default value
    assert PoolingParams(softmax=False).use_activation is False
    assert PoolingParams(activation=False).use_activation is False
    assert PoolingParams(use_activation=True, softmax=False).use_activation is True
    assert PoolingParams(task="classify").task == "classify"
    for kwargs, field in (({"softmax": "no"}, "softmax"), ({"task": "generate"}, "task"),
                          ({"use_activation": 1}, "use_activation")):
        with pytest.raises(ValueError, match=f"^{field}"):
            PoolingParams(**kwargs)


@pytest.fixture(scope="module")
def classifier():
    llm = LLM(str(bert_classifier(3)), enforce_eager=True, dtype="float32")
    yield llm
    llm.shutdown()


def test_softmax_false_reward_and_pooling_task(classifier):
    probs = [o.outputs.probs for o in classifier.classify(TEXTS)]
    raw = [o.outputs.probs for o in classifier.classify(TEXTS, PoolingParams(use_activation=False))]
    old = classifier.classify(TEXTS, PoolingParams(softmax=False), truncate_prompt_tokens=-1)
    assert [o.outputs.probs for o in old] == raw != probs
    assert [o.outputs.data.tolist() for o in classifier.reward(TEXTS)] == probs
    encoded = classifier.encode(TEXTS, pooling_task="classify")
    assert [o.outputs.data.tolist() for o in encoded] == probs
    with pytest.raises(ValueError, match="^pooling_task"):
        classifier.encode(TEXTS, pooling_task="token_classify")
    with pytest.raises(ValueError, match="classifier"):
        classifier.encode(TEXTS, pooling_task="embed")


def test_bad_prompt_types_name_the_argument(classifier):
    for bad in (5, None):
        with pytest.raises(ValueError, match="^prompts"):
            classifier.classify(bad)
    with pytest.raises(ValueError, match="^text_2"):
        classifier.score("a", 5)
    with pytest.raises(ValueError, match="^pooling_params"):
        classifier.classify("a", {"use_activation": False})
    assert len(classifier.classify("still serving")) == 1


def test_vllm_inputs_module_path():
    from compiled_llm.inputs import TextPrompt, TokensPrompt

    assert TokensPrompt(prompt_token_ids=[1]) == {"prompt_token_ids": [1]}
    assert TextPrompt(prompt="a") == {"prompt": "a"}


def test_vllm_outputs_module_path():
    import compiled_llm
    from compiled_llm import outputs

    for name in outputs.__all__:  # the same classes as the top level's
        assert getattr(outputs, name) is getattr(compiled_llm, name)
    assert {"RequestOutput", "CompletionOutput", "EmbeddingRequestOutput"} <= set(outputs.__all__)


def test_task_reward_picks_the_pooling_runner():
    llm = LLM(str(bert_classifier(3)), task="reward", enforce_eager=True, dtype="float32")
    assert llm.runner_type == "pooling" and len(llm.reward(["a", "b"])) == 2
    llm.shutdown()
