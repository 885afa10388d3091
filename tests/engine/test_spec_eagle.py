"""EAGLE-1 speculative decoding end to end on a tiny Llama with head checkpoints written here in
the published layout (fc, layers.0.* without input_layernorm): greedy output token for token
as without it (a random head; heads that repeat the last token, which the target often does,
one from the token's embedding, one from the target's hidden state: the same drafts exactly
when the head pairs each position with the right hidden state), chunked prefill with
preemption, sampled requests against the target distribution, metrics, the refusals, the pool
empty."""

# ruff: noqa: F811  (the tests take the module fixtures imported below as arguments)
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM, SamplingParams
from compiled_llm.entrypoints.cli.args import add_engine_args, engine_args
from compiled_llm.speculative import SpeculativeConfig
from tests.engine.test_spec_decode import (  # noqa: F401  (shared module fixtures)
    GREEDY,
    _exact_joint,
    _llm,
    _tokens,
    _tv,
    baseline,
    ckpt,
    prompts,
)
from tests.engine.test_spec_medusa import NUM_HEADS
from tests.engine.test_spec_medusa import _check_metrics as check_metrics
from tests.utils import random_prompts

K = NUM_HEADS


def _eagle(ckpt: Path, repeat: str | None = None, drop: str | None = None,
           extra: dict | None = None, **config_changes) -> str:
    """An EAGLE-1 head checkpoint over ckpt's shapes: random weights (fc with a bias, the
    target's embed_tokens and lm_head), or an identity layer over one half of fc's input
    (repeat): "embed" scores embed(token) with an lm_head equal to its own embed_tokens,
    "hidden" passes the target's hidden state at p (which gave token p + 1) to the target's
    lm_head; both propose the last token again."""
    config = json.loads((ckpt / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    torch.manual_seed(3)
    scale = 0.0 if repeat else 0.1  # zero attention and MLP outputs: the layer is identity
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden),
              "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    tensors = {f"layers.0.{name}.weight": torch.randn(shape) * scale
               for name, shape in shapes.items()}
    tensors["layers.0.post_attention_layernorm.weight"] = torch.ones(hidden)
    halves = [torch.eye(hidden), torch.zeros(hidden, hidden)]
    if repeat == "embed":
        embed = torch.randn(config["vocab_size"], hidden)
        assert ((embed @ embed.T).argmax(dim=1) == torch.arange(len(embed))).all()
        tensors.update({"fc.weight": torch.cat(halves, dim=1),
                        "embed_tokens.weight": embed, "lm_head.weight": embed.clone()})
    elif repeat == "hidden":
        tensors["fc.weight"] = torch.cat(halves[::-1], dim=1)
    else:
        tensors.update({"fc.weight": torch.randn(hidden, 2 * hidden) * 0.1,
                        "fc.bias": torch.randn(hidden) * 0.1})
    tensors.update(extra or {})
    tensors.pop(drop, None)
    out = Path(tempfile.mkdtemp(prefix="cllm-eagle-"))
    save_file(tensors, out / "model.safetensors")
    head_config = {**config, "num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"],
                   **config_changes}
    (out / "config.json").write_text(json.dumps(head_config))
    return str(out)


def _spec(head: str, k: int = K) -> dict:
    return {"method": "eagle", "model": head, "num_speculative_tokens": k}


def _check_metrics(llm, accepted: bool) -> None:
    check_metrics(llm)  # Medusa's checks: its NUM_HEADS drafts a step, as K here
    per_pos = llm.engine.scheduler.spec_stats.accepted_per_pos
    assert len(per_pos) == K
    if accepted:
        assert per_pos[0] > 0 and per_pos[1] > 0  # the head's own hidden states fed back


def check_greedy_and_seeded(llm, prompts, baseline) -> None:
    """Greedy output as without drafts, seeded sampled output repeats, the pool empty."""
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    _check_metrics(llm, accepted=False)
    assert llm.engine.num_used_blocks == 0
    sampled = SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    first = _tokens(llm.generate(prompts[:2], sampled, use_tqdm=False))
    assert all(len(tokens) == 12 for tokens in first)
    assert _tokens(llm.generate(prompts[:2], sampled, use_tqdm=False)) == first
    assert llm.engine.num_used_blocks == 0


def test_eagle_greedy_equals_spec_off(ckpt, prompts, baseline):
    check_greedy_and_seeded(_llm(ckpt, speculative_config=_spec(_eagle(ckpt))), prompts,
                            baseline)


def test_head_reads_the_target_hidden_states(ckpt, prompts, baseline):
    stats = []
    for repeat in ("embed", "hidden"):
        llm = _llm(ckpt, speculative_config=_spec(_eagle(ckpt, repeat=repeat)))
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
        _check_metrics(llm, accepted=True)
        assert llm.engine.num_used_blocks == 0
        stats.append(llm.engine.scheduler.spec_stats)
    assert stats[0] == stats[1]  # the same drafts, step for step


def test_eagle_chunked_prefill_and_preemption(ckpt, prompts, baseline):
    tight = _llm(ckpt, speculative_config=_spec(_eagle(ckpt, repeat="hidden")),
                 max_num_batched_tokens=16, num_gpu_blocks_override=14)
    assert _tokens(tight.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert tight.engine.scheduler.num_preemptions > 0
    assert tight.engine.scheduler.spec_stats.num_accepted_tokens > 0
    assert tight.engine.num_used_blocks == 0


def test_eagle_sampled_output_follows_the_target_distribution(ckpt):
    # the repeat-last head's drafts are sometimes what the target draws: acceptance, the
    # recovered draw and the bonus draw all take part (small sample: see test_spec_decode)
    llm = _llm(ckpt, speculative_config=_spec(_eagle(ckpt, repeat="embed"), k=2))
    check_target_distribution(llm, ckpt, random_prompts(1, 300, lo=6, hi=7, seed=3)[0])


def check_target_distribution(llm, ckpt: Path, prompt: list[int]) -> None:
    """200 continuations of prompt sampled at temperature 1, top-k 2, 3 tokens, against the
    target's exact joint distribution; some drafts accepted, some not; the pool empty."""
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=3, ignore_eos=True)
    seen = [tuple(t) for t in _tokens(llm.generate([{"prompt_token_ids": prompt}] * 200,
                                                   params, use_tqdm=False))]
    assert _tv(seen, _exact_joint(ckpt, prompt, 2, 3)) < 0.17  # E[TV] about 0.08
    stats = llm.engine.scheduler.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert llm.engine.num_used_blocks == 0


def test_eagle_refusals(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    cases = [
        (_eagle(ckpt, hidden_size=2 * config["hidden_size"]), "model.*hidden_size"),
        (_eagle(ckpt, vocab_size=config["vocab_size"] + 1), "model.*vocab_size"),
        (_eagle(ckpt, intermediate_size=None), "model.*intermediate_size"),
        (_eagle(ckpt, drop="fc.weight"), "model.*lacks.*fc.weight"),
        (_eagle(ckpt, drop="layers.0.mlp.down_proj.weight"), "model.*lacks.*down_proj"),
        (_eagle(ckpt, extra={"fc.weight": torch.zeros(4, 4)}), "model.*fc.weight.*shape"),
        (_eagle(ckpt, extra={"layers.1.mlp.up_proj.weight": torch.zeros(4, 4)}),
         "model.*layers.1"),
        (_eagle(ckpt, extra={"midlayer.norm.weight": torch.ones(4)}), "model.*'eagle3'"),
        (tempfile.mkdtemp(), "model.*config.json"),
    ]
    for head, match in cases:
        with pytest.raises(ValueError, match=f"speculative_config.{match}"):
            _llm(ckpt, speculative_config=_spec(head))
    with pytest.raises(ValueError, match="speculative_config.model.*required"):
        SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="speculative_config.method.*not supported yet"):
        SpeculativeConfig.from_dict({"method": "mtp", "model": "/d",
                                     "num_speculative_tokens": 2})


def test_eagle_pickle_checkpoint_loads_by_default(ckpt, prompts, baseline):
    head = Path(_eagle(ckpt))
    tensors = load_file(head / "model.safetensors")
    (head / "model.safetensors").unlink()
    torch.save(tensors, head / "pytorch_model.bin")
    with pytest.raises(ValueError, match="speculative_config.model.*load_format"):
        _llm(ckpt, speculative_config=_spec(str(head)), load_format="safetensors")
    llm = _llm(ckpt, speculative_config=_spec(str(head)))
    assert _tokens(llm.generate(prompts[:2], GREEDY, use_tqdm=False)) == baseline[:2]


def test_eagle_cli_spelling():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    spec = '{"method": "eagle", "model": "/heads", "num_speculative_tokens": 4}'
    args = engine_args(parser.parse_args(["--speculative-config", spec]))
    assert SpeculativeConfig.from_dict(args.speculative_config) == SpeculativeConfig(
        "eagle", 4, model="/heads")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eagle_cuda_graphs_greedy_equal(ckpt, prompts):
    """Compiled with CUDA graphs (target and head): greedy equals spec off, drafts accepted."""
    with LLM(str(ckpt), dtype="float32", engine_core_process=False) as plain:
        expected = _tokens(plain.generate(prompts, GREEDY, use_tqdm=False))
    with LLM(str(ckpt), dtype="float32", engine_core_process=False,
             speculative_config=_spec(_eagle(ckpt, repeat="hidden"))) as llm:
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
        assert llm.engine.scheduler.spec_stats.num_accepted_tokens > 0
        assert llm.engine.num_used_blocks == 0
