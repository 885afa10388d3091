"""lm-evaluation-harness against the live server: its `local-completions` model, finding the
tokenizer through /tokenizer_info, runs a local multiple-choice task (a YAML task and a jsonl
dataset written here; nothing from the network), and every per-choice loglikelihood and the
accuracy match transformers on the served checkpoint."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from tests.entrypoints.server.conftest import API_KEY

lm_eval = pytest.importorskip("lm_eval")

DOCS = [
    {"question": "The quick brown", "choices": ["fox", "dog", "copy"], "answer": 0},
    {"question": "Permission is hereby", "choices": ["granted", "implied", "lazy"], "answer": 0},
    {"question": "THE SOFTWARE IS PROVIDED", "choices": ["AS IS", "free", "emoji"], "answer": 0},
    {"question": "jumps over the lazy", "choices": ["dog", "software", "charge"], "answer": 0},
    {"question": "free of", "choices": ["charge", "warranty", "kind"], "answer": 1},
    {"question": "to any person obtaining a", "choices": ["copy", "fox", "text"], "answer": 2},
]

TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)  # what local-completions sends as the key
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tmp_path / "tiny_mc.yaml").write_text(TASK.format(data=data))
    return tmp_path


@functools.cache
def _load(model_dir: str):
    import transformers

    return (transformers.AutoTokenizer.from_pretrained(model_dir),
            transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval())


def _reference(model_dir: str, context: str, continuation: str) -> float:
    """transformers' loglikelihood of continuation after context, split as lm-eval splits
    it (trailing spaces of the context move to the continuation)."""
    tok, model = _load(model_dir)
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False)
    num_context = len(tok.encode(context, add_special_tokens=False))
    with torch.no_grad():
        logprobs = model(torch.tensor([whole])).logits[0].float().log_softmax(-1)
    return sum(logprobs[i - 1, whole[i]].item() for i in range(num_context, len(whole)))


def test_lm_eval_multiple_choice_matches_transformers(server, task_dir):
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    lm = LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model=server.model,
                             tokenizer_backend="auto", auth_token=API_KEY, batch_size=4,
                             max_retries=1, max_length=512)
    assert lm.tokenizer_backend == "remote"  # found through /tokenizer_info
    results = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc"], log_samples=True,
                                      task_manager=TaskManager(include_path=str(task_dir)))
    samples = results["samples"]["tiny_mc"]
    assert len(samples) == len(DOCS)
    correct = []
    for sample in samples:
        got = [resp[0][0] for resp in sample["resps"]]
        expected = [_reference(server.model, *args) for args in sample["arguments"]]
        torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-4)
        correct.append(max(range(len(expected)), key=expected.__getitem__)
                       == sample["doc"]["answer"])
    assert results["results"]["tiny_mc"]["acc,none"] == pytest.approx(sum(correct) / len(DOCS))
    assert server.wait_idle()["compiled_llm:kv_cache_used_blocks"] == 0
