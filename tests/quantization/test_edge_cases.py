"""Edge cases of published quantized checkpoints: compiled graphs never shared between two
quantizations whose tensors look alike, a compressed-tensors kv_cache_scheme's scales in an FP8
KV cache, and the layouts this loader cannot hold refused by name (a quantized LM head, layers
whose inputs do not split into whole groups)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.quantization.compressed_tensors import CompressedTensorsFormat
from compiled_llm.quantization.formats import BlockFp8Format, GptqFormat
from compiled_llm.quantization.loading import prepare_quantized
from tests.quantization.packers import fp8_moe_pair, packed_pair
from tests.quantization.test_checkpoints import W8A8_ATOL, _prompt_logprobs
from tests.utils import random_prompts

KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def _edited_copy(source: Path, edit_tensors, edit_qconfig=None) -> Path:
    """A copy of checkpoint `source` with its tensors (and quantization_config) edited."""
    out = Path(tempfile.mkdtemp(prefix="cllm-quant-edge-"))
    for path in source.iterdir():
        shutil.copy(path, out / path.name)
    tensors = {k: v.clone() for k, v in load_file(str(out / "model.safetensors")).items()}
    edit_tensors(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if edit_qconfig is not None:
        config = json.loads((out / "config.json").read_text())
        edit_qconfig(config["quantization_config"])
        (out / "config.json").write_text(json.dumps(config))
    return out


def test_fp8_checkpoint_and_fp8_at_load_do_not_share_compiled_graphs():
    """Block-FP8 linears and quantization="fp8"'s Fp8Linear store tensors of the same names
    and shapes when every dense K is 128: the cache key must still tell them apart (a shared
    snapshot ran the other's graph: KeyError 'fused_weight_scale')."""
    from compiled_llm.compile.backend import model_factors
    from compiled_llm.compile.cache import cache_key
    from compiled_llm.compile.snapshot import snapshot_name
    from compiled_llm.worker.loader import load_model

    quantized, reference = fp8_moe_pair()
    cpu = torch.device("cpu")
    block = load_model(quantized, torch.float32, cpu, 64)
    at_load = load_model(reference, torch.float32, cpu, 64, quantization="fp8")
    assert snapshot_name(block) == snapshot_name(at_load)  # what made the collision possible
    assert (cache_key(model_factors(block, torch.float32))
            != cache_key(model_factors(at_load, torch.float32)))


def test_kv_cache_scheme_scales_fill_the_fp8_kv_cache():
    quantized, reference = packed_pair("ct_FP8_DYNAMIC")

    def add_scales(tensors):
        for layer in range(2):
            for name in ("k_scale", "v_scale"):
                tensors[f"model.layers.{layer}.self_attn.{name}"] = torch.tensor([0.05])

    edited = _edited_copy(quantized, add_scales,
                          lambda qconfig: qconfig.update(kv_cache_scheme=KV))
    llm = LLM(str(edited), enforce_eager=True, dtype="float32", kv_cache_dtype="fp8")
    runner = llm.engine.executor.worker.runner
    assert runner.kv_caches[0].dtype == torch.float8_e4m3fn and not runner.calibrate_kv
    torch.testing.assert_close(runner.kv_scales, torch.full_like(runner.kv_scales, 0.05))
    prompts = random_prompts(2, llm.engine.model_config.vocab_size, seed=6)
    got, expected = _prompt_logprobs(llm, reference, prompts)
    torch.testing.assert_close(got, expected, atol=W8A8_ATOL, rtol=1e-4)


def test_quantized_lm_head_refused_by_name():
    quantized, _ = packed_pair("ct_W4A16")

    def quantize_head(tensors):
        vocab, hidden = tensors.pop("lm_head.weight").shape
        tensors.update({"lm_head.weight_packed": torch.zeros(vocab, hidden // 8,
                                                             dtype=torch.int32),
                        "lm_head.weight_scale": torch.ones(vocab, hidden // 128),
                        "lm_head.weight_shape": torch.tensor([vocab, hidden])})

    with pytest.raises(ValueError, match="compressed-tensors checkpoint: a quantized lm_head"):
        LLM(str(_edited_copy(quantized, quantize_head)), enforce_eager=True, dtype="float32")


@pytest.mark.parametrize("fmt", [GptqFormat(128), BlockFp8Format(),
                                 CompressedTensorsFormat("w4a16", group_size=128)])
def test_partial_groups_refused_naming_the_linear(tmp_path, fmt):
    """in_features 320 with groups (or FP8 blocks) of 128: the last group would be partial,
    which vLLM refuses too; the error names the linear and the field."""
    model = torch.nn.Module()
    model.down_proj = torch.nn.Linear(320, 64)
    save_file({f"down_proj.{fmt.marker}": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"down_proj: {fmt.name} checkpoint: in_features=320 "
                                         "is not a multiple of quantization_config group_size"):
        prepare_quantized(model, fmt, [tmp_path / "model.safetensors"])
