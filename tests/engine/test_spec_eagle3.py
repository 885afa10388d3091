"""EAGLE-3 speculative decoding end to end on a tiny Llama with heads written here in the published
layout (fc over three target layers, midlayer.*, norm, a half-size draft vocabulary with d2t and
t2d): greedy output token for token as without it, eager and compiled targets handing over the
same aux states (with CUDA graphs on a GPU), sampled output against the target distribution,
metrics, chunked prefill with preemption, the compile cache keys, the refusals, the pool empty."""

# ruff: noqa: F811  (the tests take the module fixtures imported below as arguments)
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM, SamplingParams
from tests.engine.test_spec_decode import (  # noqa: F401  (shared module fixtures)
    GREEDY,
    _llm,
    _tokens,
    baseline,
    ckpt,
    prompts,
)
from tests.engine.test_spec_eagle import (
    _eagle,
    check_greedy_and_seeded,
    check_target_distribution,
)

K = 3
AUX = [0, 1, 1]  # the 2-layer target: vLLM's default (2, L // 2, L - 3) needs more layers


def _eagle3(ckpt: Path, aux: list[int] | None = AUX, drop: str | None = None,
            extra: dict | None = None, repeat: bool = False) -> str:
    """A random EAGLE-3 head over ckpt's shapes, draft vocabulary half the target's; or
    (repeat) an identity midlayer whose fc keeps the first aux state (layer 0's input: the
    token's embedding) and whose lm_head is the target's embedding over the whole vocabulary,
    so it proposes the token before the last again, read from the target's aux states."""
    config = json.loads((ckpt / "config.json").read_text())
    hidden, inter, vocab = (config[name] for name in ("hidden_size", "intermediate_size",
                                                      "vocab_size"))
    kv = config["num_key_value_heads"] * hidden // config["num_attention_heads"]
    torch.manual_seed(4)
    scale = 0.0 if repeat else 0.1  # zero attention and MLP outputs: the layer is identity
    shapes = {"self_attn.q_proj": (hidden, 2 * hidden), "self_attn.k_proj": (kv, 2 * hidden),
              "self_attn.v_proj": (kv, 2 * hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    tensors = {f"midlayer.{name}.weight": torch.randn(shape) * scale
               for name, shape in shapes.items()}
    for norm in ("midlayer.input_layernorm", "midlayer.hidden_norm",
                 "midlayer.post_attention_layernorm", "norm"):
        tensors[f"{norm}.weight"] = torch.ones(hidden)
    draft_vocab = vocab if repeat else vocab // 2
    kept = torch.randperm(vocab)[:draft_vocab].sort().values  # target ids of the draft ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    tensors.update({"fc.weight": torch.randn(hidden, 3 * hidden) * 0.1,
                    "lm_head.weight": torch.randn(draft_vocab, hidden) * 0.1,
                    "d2t": kept - torch.arange(draft_vocab), "t2d": t2d})
    if repeat:
        embed = load_file(ckpt / "model.safetensors")["model.embed_tokens.weight"]
        assert ((embed @ embed.T).argmax(dim=1) == torch.arange(vocab)).all()
        fc = torch.zeros(hidden, 3 * hidden)
        fc[:, :hidden] = torch.eye(hidden)
        tensors.update({"fc.weight": fc, "lm_head.weight": embed.clone()})
    tensors.update(extra or {})
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


def _check_aux_states(llm, ckpt: Path, prompt: list[int], num_rows: int) -> None:
    """The target's aux states of its latest forward (the last num_rows positions of prompt)
    are the inputs of layers AUX in transformers (hidden_states[i], embeddings for 0)."""
    import transformers

    aux = llm.engine.executor.spec_runner.proposer.aux
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad():
        layer_inputs = model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    expected = torch.cat([layer_inputs[i][0, -num_rows:] for i in AUX], dim=-1)
    torch.testing.assert_close(aux.states(num_rows).cpu(), expected, atol=1e-4, rtol=1e-4)


def _prefill(llm, prompt: list[int]) -> None:
    """One prefill step of prompt alone (its one token sampled in that step)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)


def test_aux_states_are_the_targets_layer_inputs(ckpt):
    llm = _llm(ckpt, speculative_config=_spec(_eagle3(ckpt)))
    prompt = list(range(5, 17))
    _prefill(llm, prompt)
    _check_aux_states(llm, ckpt, prompt, len(prompt))


def test_eagle3_compiled_target_equals_eager_and_spec_off(ckpt, prompts, baseline):
    """The default compile mode (the backend's split graph) hands over the same aux states
    as the eager target: the same tokens and the same drafts accepted, step for step."""
    spec = _spec(_eagle3(ckpt, repeat=True))
    eager = _llm(ckpt, speculative_config=spec)
    assert _tokens(eager.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    llm = LLM(str(ckpt), dtype="float32", speculative_config=spec)
    assert llm.engine.executor.worker.runner.compile_cfg.mode == "backend"
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    stats = llm.engine.scheduler.spec_stats
    assert stats == eager.engine.scheduler.spec_stats
    assert stats.accepted_per_pos[0] > 0  # the drafts read layer 0's input at the right rows
    assert llm.engine.num_used_blocks == 0
    prompt = list(range(5, 17))
    _prefill(llm, prompt)
    _check_aux_states(llm, ckpt, prompt, len(prompt))
    assert llm.engine.num_used_blocks == 0


def test_eagle3_compiled_sampled_output_follows_the_target_distribution(ckpt, prompts,
                                                                       baseline):
    # a prompt whose greedy continuation alternates two tokens: the repeat head's drafts (the
    # token before the last) are often what the target draws, so acceptance, the recovered
    # draw and the bonus draw all take part (small sample: see test_spec_decode)
    llm = LLM(str(ckpt), dtype="float32",
              speculative_config={**_spec(_eagle3(ckpt, repeat=True)),
                                  "num_speculative_tokens": 2})
    i, j = next((i, j) for i, out in enumerate(baseline) for j in range(len(out) - 5)
                if out[j:j + 4] == out[j + 2:j + 6] and out[j] != out[j + 1])
    prompt = prompts[i]["prompt_token_ids"] + baseline[i][:j + 4]  # ends a b a b
    check_target_distribution(llm, ckpt, prompt)


def test_aux_taps_key_the_compiled_code(ckpt):
    from compiled_llm.compile.backend import model_factors
    from compiled_llm.compile.cache import cache_key
    from compiled_llm.compile.snapshot import snapshot_name
    from compiled_llm.worker.aux_states import TappedRMSNorm, install_aux_taps
    from compiled_llm.worker.loader import load_model

    def keys(ids: list[int] | None, rows: int = 64) -> tuple[str, str, list[str]]:
        model = load_model(ckpt, torch.float32, torch.device("cpu"), 128)
        if ids is not None:
            install_aux_taps(model, ids, rows, torch.float32, torch.device("cpu"))
        names = [name for name, _ in model.named_parameters()]
        return cache_key(model_factors(model, torch.float32)), snapshot_name(model), names

    plain, tapped = keys(None), keys(AUX)
    assert plain[2] == tapped[2]  # the taps keep the layers' parameter names
    others = [plain, tapped, keys([1]), keys(AUX, rows=128)]
    for index in (0, 1):  # on vs off, which layers and how many rows: each its own key
        assert len({key[index] for key in others}) == len(others)
    assert keys(AUX)[:2] == tapped[:2]
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 128)
    install_aux_taps(model, AUX, 8, torch.float32, torch.device("cpu"))
    assert isinstance(model.model.layers[1].input_layernorm, TappedRMSNorm)
    with pytest.raises(ValueError, match="speculative_config.method 'eagle3'.*model.layers"):
        install_aux_taps(torch.nn.Linear(2, 2), AUX, 8, torch.float32, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eagle3_cuda_graphs_greedy_equal(ckpt, prompts):
    """Compiled with piecewise and full CUDA graphs (the defaults): greedy equals spec off and
    the eager EAGLE-3 run's drafts; the aux states are the target's after a piecewise prefill
    and after a full-graph decode step (a request with logprobs decodes without drafts)."""
    from compiled_llm.compile import counters

    spec = _spec(_eagle3(ckpt, repeat=True))
    with LLM(str(ckpt), dtype="float32", engine_core_process=False) as plain:
        expected = _tokens(plain.generate(prompts, GREEDY, use_tqdm=False))
    with LLM(str(ckpt), dtype="float32", enforce_eager=True, engine_core_process=False,
             speculative_config=spec) as eager:
        assert _tokens(eager.generate(prompts, GREEDY, use_tqdm=False)) == expected
        eager_stats = eager.engine.scheduler.spec_stats
    with LLM(str(ckpt), dtype="float32", engine_core_process=False,
             speculative_config=spec) as llm:
        before = counters.piecewise_steps
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
        assert counters.piecewise_steps > before
        assert llm.engine.scheduler.spec_stats == eager_stats
        assert eager_stats.num_accepted_tokens > 0
        prompt = list(range(5, 17))
        _prefill(llm, prompt)
        _check_aux_states(llm, ckpt, prompt, len(prompt))
        replays = counters.full_graph_replays
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=1)
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        assert counters.full_graph_replays > replays
        _check_aux_states(llm, ckpt, prompt + out[0].outputs[0].token_ids[:1], 1)
        assert llm.engine.num_used_blocks == 0


def test_default_aux_layers_count_decoder_layers_not_cache_slots():
    """LongCat-Flash's num_hidden_layers counts two attentions a layer: vLLM's default taps
    (2, L // 2, L - 3) take L from the decoder layers themselves."""
    from compiled_llm.worker.eagle3 import aux_layer_ids, decoder_layers
    from compiled_llm.worker.loader import load_model
    from tests.utils import make_checkpoint

    model = load_model(make_checkpoint("longcat_flash"), torch.float32, torch.device("cpu"), 64)
    layers = len(model.model.layers)
    assert model.config.num_hidden_layers == 2 * layers
    assert decoder_layers(model) == layers
    with pytest.raises(ValueError, match="name layers the target's"):
        aux_layer_ids({}, decoder_layers(model))  # too few layers for vLLM's default taps
