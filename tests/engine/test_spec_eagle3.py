"""EAGLE-3 speculative decoding end to end on a tiny Llama (eager) with a random head written here
in the published layout (fc over three target layers, midlayer.*, norm, a half-size draft
vocabulary with d2t and t2d): greedy output token for token as without it, sampled requests,
metrics, chunked prefill with preemption, the refusals, the pool empty."""

# ruff: noqa: F811  (the tests take the module fixtures imported below as arguments)
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from compiled_llm import LLM, SamplingParams
from tests.engine.test_spec_decode import (  # noqa: F401  (shared module fixtures)
    GREEDY,
    _llm,
    _tokens,
    baseline,
    ckpt,
    prompts,
)
from tests.engine.test_spec_eagle import _eagle, check_greedy_and_seeded

K = 3
AUX = [0, 1, 1]  # the 2-layer target: vLLM's default (2, L // 2, L - 3) needs more layers


def _eagle3(ckpt: Path, aux: list[int] | None = AUX, drop: str | None = None,
            extra: dict | None = None) -> str:
    """A random EAGLE-3 head over ckpt's shapes, draft vocabulary half the target's."""
    config = json.loads((ckpt / "config.json").read_text())
    hidden, inter, vocab = (config[name] for name in ("hidden_size", "intermediate_size",
                                                      "vocab_size"))
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    torch.manual_seed(4)
    shapes = {"self_attn.q_proj": (hidden, 2 * hidden), "self_attn.k_proj": (kv, 2 * hidden),
              "self_attn.v_proj": (kv, 2 * hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    tensors = {f"midlayer.{name}.weight": torch.randn(shape) * 0.1
               for name, shape in shapes.items()}
    for norm in ("midlayer.input_layernorm", "midlayer.hidden_norm",
                 "midlayer.post_attention_layernorm", "norm"):
        tensors[f"{norm}.weight"] = torch.ones(hidden)
    draft_vocab = vocab // 2
    kept = torch.randperm(vocab)[:draft_vocab].sort().values  # target ids of the draft ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    tensors.update({"fc.weight": torch.randn(hidden, 3 * hidden) * 0.1,
                    "lm_head.weight": torch.randn(draft_vocab, hidden) * 0.1,
                    "d2t": kept - torch.arange(draft_vocab), "t2d": t2d, **(extra or {})})
    tensors.pop(drop, None)
    out = Path(tempfile.mkdtemp(prefix="cllm-eagle3-"))
    save_file(tensors, out / "model.safetensors")
    head_config = {**config, "num_hidden_layers": 1, "draft_vocab_size": draft_vocab,
                   "architectures": ["LlamaForCausalLMEagle3"]}
    if aux is not None:
        head_config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux}
    (out / "config.json").write_text(json.dumps(head_config))
    return str(out)


def _spec(head: str, method: str = "eagle3") -> dict:
    return {"method": method, "model": head, "num_speculative_tokens": K}


def test_eagle3_greedy_equals_spec_off(ckpt, prompts, baseline):
    check_greedy_and_seeded(_llm(ckpt, speculative_config=_spec(_eagle3(ckpt))), prompts,
                            baseline)


def test_eagle3_chunked_prefill_and_preemption(ckpt, prompts, baseline):
    tight = _llm(ckpt, speculative_config=_spec(_eagle3(ckpt)), max_num_batched_tokens=16,
                 num_gpu_blocks_override=14)
    assert _tokens(tight.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert tight.engine.scheduler.num_preemptions > 0
    assert tight.engine.num_used_blocks == 0


def test_eagle3_refusals(ckpt):
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    cases = [
        (_spec(_eagle3(ckpt, aux=None)), "model.*eagle_aux_hidden_state_layer_ids"),
        (_spec(_eagle3(ckpt, drop="d2t")), "model.*d2t"),
        (_spec(_eagle3(ckpt, extra={"d2t": torch.full((vocab // 2,), vocab)})),
         "model.*d2t maps"),
        (_spec(_eagle3(ckpt, drop="lm_head.weight")), "model.*lacks lm_head.weight"),
        (_spec(_eagle3(ckpt, drop="midlayer.hidden_norm.weight")), "model.*lacks.*hidden_norm"),
        (_spec(_eagle3(ckpt, extra={"fc.weight": torch.zeros(4, 4)})), "model.*fc.weight"),
        (_spec(_eagle3(ckpt), method="eagle"), "model.*EAGLE-3.*'eagle3'"),
        (_spec(_eagle(ckpt)), "model.*EAGLE-1.*'eagle'"),
    ]
    for spec, match in cases:
        with pytest.raises(ValueError, match=f"speculative_config.{match}"):
            _llm(ckpt, speculative_config=spec)


def test_aux_states_are_the_targets_layer_inputs(ckpt):
    import transformers

    llm = _llm(ckpt, speculative_config=_spec(_eagle3(ckpt)))
    prompt = list(range(5, 17))
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)  # one prefill step
    aux = llm.engine.executor.spec_runner.proposer.aux
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad():  # hidden_states[i]: the input of layer i (the embeddings for 0)
        layer_inputs = model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    expected = torch.cat([layer_inputs[i][0] for i in AUX], dim=-1)
    torch.testing.assert_close(aux.states(len(prompt)), expected, atol=1e-4, rtol=1e-4)


def test_eagle3_needs_an_eager_target():
    from types import SimpleNamespace

    from compiled_llm.speculative import SpeculativeConfig
    from compiled_llm.worker.eagle3 import Eagle3Proposer

    proposer = Eagle3Proposer.__new__(Eagle3Proposer)  # only load_head's first check runs
    proposer.cfg = SpeculativeConfig("eagle3", K, model="/heads")
    compiled = SimpleNamespace(compile_cfg=SimpleNamespace(mode="backend"))
    with pytest.raises(ValueError, match="speculative_config.method 'eagle3'.*enforce_eager"):
        proposer.load_head(compiled, "auto")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eagle3_cuda_greedy_equal(ckpt, prompts):
    """On CUDA (eager, as eagle3 requires): greedy equals spec off, the pool empty."""
    with LLM(str(ckpt), dtype="float32", enforce_eager=True,
             engine_core_process=False) as plain:
        expected = _tokens(plain.generate(prompts, GREEDY, use_tqdm=False))
    with LLM(str(ckpt), dtype="float32", enforce_eager=True, engine_core_process=False,
             speculative_config=_spec(_eagle3(ckpt))) as llm:
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
        assert llm.engine.scheduler.spec_stats.num_drafts > 0
        assert llm.engine.num_used_blocks == 0
