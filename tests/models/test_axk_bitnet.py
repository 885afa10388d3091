"""A.X-K1, A.X-K2 and BitNet against transformers on checkpoints whose norm weights and
correction biases are random (transformers saves ones and zeros): A.X-K1's MoE output norm
(a dense layer's stored one skipped, as the released checkpoints hold one); A.X-K2 within
index_topk (its indexer skipped) with its gated norms, gated attention output and router
(grouped with 0.0 masking, or ungrouped); BitNet's sub-norms; the options refused by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.config import model_len_bounds
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    make_checkpoint,
    random_norms_and_correction_bias,
)

# a released A.X-K1 checkpoint also stores its dense layers' post_mlp_layernorm, unused
_DENSE_NORM = (("model.layers.0.post_mlp_layernorm.weight", torch.full((64,), 3.0)),)


@pytest.mark.parametrize(("name", "extra"), [("axk1", _DENSE_NORM), ("axk2", ()),
                                             ("bitnet", ())])
def test_greedy_and_prompt_logprobs_match_transformers(name, extra):
    edit = random_norms_and_correction_bias
    assert_matches_transformers(edited_checkpoint(name, edit, extra=extra))


@pytest.mark.parametrize("groups", [(2, 1), (None, None)])
def test_axk2_router_matches_transformers(groups):
    """Grouped routing masks the dropped groups' experts to 0.0, not -inf: with biases far
    below 0, dropped experts win over kept ones, in transformers as here; ungrouped too."""
    import transformers
    from transformers.models.axk2.modeling_axk2 import AXK2TopkRouter

    from compiled_llm.models.axk2 import AXK2MoeBlock

    hf = load_hf_config(make_checkpoint("axk2"))
    _, cfg = build_model_config({**hf, "n_group": groups[0], "topk_group": groups[1]})
    ours = AXK2MoeBlock(cfg)
    theirs = AXK2TopkRouter(transformers.AXK2Config(**{**hf, "n_group": groups[0],
                                                         "topk_group": groups[1]}))
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(8, 64, generator=gen), torch.randn(8, generator=gen) - 0.9
    theirs.weight.data.copy_(weight)
    theirs.e_score_correction_bias.copy_(bias)
    ours.gate.weight.data.copy_(weight)
    ours.gate.e_score_correction_bias.data.copy_(bias)
    hidden = torch.randn(32, 64, generator=gen)
    _, ref_weights, ref_ids = theirs(hidden)
    weights, ids = ours.route(ours.gate(hidden))
    order, ref_order = ids.sort(-1), ref_ids.sort(-1)
    assert torch.equal(order.values, ref_order.values)
    torch.testing.assert_close(weights.gather(1, order.indices),
                               ref_weights.gather(1, ref_order.indices))


def test_axk_config_reading():
    """A.X-K2's max_model_len is capped at index_topk; without mlp_layer_types, layers from
    first_k_dense_replace on at every moe_layer_freq-th are sparse (transformers 5.25's rule)."""
    hf = load_hf_config(make_checkpoint("axk2"))
    assert model_len_bounds(hf) == (96, 96)
    _, cfg = build_model_config({**hf, "mlp_layer_types": None, "first_k_dense_replace": 0,
                                 "moe_layer_freq": 2})
    assert cfg.moe.mlp_only_layers == (1,) and cfg.gated_norm_rank == 8


@pytest.mark.parametrize(("name", "change", "match"), [
    ("axk1", {"q_lora_rank": None}, "q_lora_rank null is not supported"),
    # transformers 5.17 reads first_k_dense_replace alone: the two versions would differ
    ("axk1", {"mlp_layer_types": ["dense", "dense", "sparse"]}, "mlp_layer_types"),
    ("axk2", {"n_group": None}, "n_group None / topk_group 1 is not supported"),
    ("axk2", {"n_group": 8, "topk_group": 1}, "n_group 8 is not supported"),
    ("axk2", {"index_topk": 0}, "index_topk 0 is not supported"),
    ("bitnet", {"quantization_config": {"quant_method": "bitnet"}},
     "quantization_config.quant_method 'bitnet' is not supported"),
    ("bitnet", {"head_dim": 8}, "head_dim 8 is not supported"),
])
def test_options_refused_by_name(name, change, match):
    hf = load_hf_config(make_checkpoint(name))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})


def test_axk1_without_correction_biases_loads_them_as_zeros(tmp_path):
    """Released A.X-K1 checkpoints route without e_score_correction_bias (transformers' zeros):
    each is zeroed; any other absent tensor is still refused."""
    from safetensors.torch import load_file, save_file

    from compiled_llm.worker.loader import load_model

    src = make_checkpoint("axk1")
    for path in src.iterdir():
        if path.suffix != ".safetensors":
            (tmp_path / path.name).write_bytes(path.read_bytes())
    tensors = {}
    for path in src.glob("*.safetensors"):
        tensors.update(load_file(path))
    kept = {k: v for k, v in tensors.items() if not k.endswith("e_score_correction_bias")}
    assert len(kept) < len(tensors)
    save_file(kept, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = load_model(tmp_path, torch.float32, torch.device("cpu"), 64)
    biases = [p for n, p in model.named_parameters() if n.endswith("e_score_correction_bias")]
    assert biases and all(torch.count_nonzero(p) == 0 for p in biases)
    del kept["model.norm.weight"]
    save_file(kept, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing tensors: .*model.norm.weight"):
        load_model(tmp_path, torch.float32, torch.device("cpu"), 64)
