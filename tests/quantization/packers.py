"""Tiny quantized checkpoints for the tests: a random Llama (hidden 128, 2 layers) quantized as
each format stores it, written from the formats' specifications (GPTQ, AWQ, block and per-tensor
FP8) or by compressed-tensors itself, and a random Qwen3-MoE in block FP8 (per expert, as
published); each next to the same model with the dequantized weights in float32.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import tempfile
from pathlib import Path

import torch

from tests.utils import tokenizer_dir

GROUP = 128
LLAMA = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
# wide enough for tensor_parallel_size 2: each rank's o_proj / down_proj inputs are whole
# 128-groups and its k / v rows whole 128-row FP8 blocks (tests/distributed/test_tp_quantized.py)
TP_LLAMA = dict(LLAMA, hidden_size=256, intermediate_size=512, head_dim=128)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of a word holds column 8c + AWQ_ORDER[j]


def _pack(values: torch.Tensor, dim: int, order=tuple(range(8))) -> torch.Tensor:
    """uint values 0..15 -> int32, 8 per word along `dim`, nibble j = value order[j]."""
    moved = values.to(torch.int64).movedim(dim, -1)
    words = moved.reshape(*moved.shape[:-1], -1, 8)
    packed = sum(words[..., order[j]] << (4 * j) for j in range(8))
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim).contiguous()


def _groups(weight: torch.Tensor, g_idx: torch.Tensor, group: int = GROUP):
    """weight [N, K] regrouped [N, K/G, G] by g_idx (act order), and the inverse."""
    order = torch.argsort(g_idx, stable=True)
    grouped = weight[:, order].reshape(weight.shape[0], -1, group)
    return grouped, torch.argsort(order)


def gptq(weight: torch.Tensor, desc_act: bool, sym: bool = True, v2: bool = False,
         group: int = GROUP) -> tuple[dict, torch.Tensor]:
    """GPTQ tensors and the dequantized weight: symmetric (zero 8) or min/max asymmetric,
    qzeros stored as zero - 1 (checkpoint_format gptq) or as the zero (gptq_v2); group -1 is
    one group per row."""
    n, k = weight.shape
    group = k if group == -1 else group
    perm = torch.randperm(k) if desc_act else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
    grouped, inverse = _groups(weight, g_idx, group)
    if sym:
        scale = (2 * grouped.abs().amax(-1) / 15).clamp(min=1e-8).half().float()  # [N, K/G]
        zero = torch.full_like(scale, 8)
    else:  # v1 cannot store a zero of 0 (it would read back as 16): keep zeros >= 1
        low, high = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
        scale = ((high - low) / 14).clamp(min=1e-8).half().float()
        zero = (torch.round(-low / scale) + 1).clamp(1, 15)
    q = (torch.round(grouped / scale[..., None]) + zero[..., None]).clamp(0, 15)
    deq = ((q - zero[..., None]) * scale[..., None]).reshape(n, k)[:, inverse]
    q = q.reshape(n, k)[:, inverse]  # back to input order
    zeros = zero.t() - (0 if v2 else 1)
    return {"qweight": _pack(q.t(), 0), "qzeros": _pack(zeros, 1),
            "scales": scale.t().half().contiguous(), "g_idx": g_idx}, deq


def awq(weight: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """AWQ GEMM tensors (asymmetric, interleaved along N) and the dequantized weight."""
    n, k = weight.shape
    grouped = weight.reshape(n, k // GROUP, GROUP)
    low, high = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
    scale = ((high - low) / 15).clamp(min=1e-8).half().float()
    zero = torch.round(-low / scale).clamp(0, 15)
    q = (torch.round(grouped / scale[..., None]) + zero[..., None]).clamp(0, 15)
    deq = ((q - zero[..., None]) * scale[..., None]).reshape(n, k)
    return {"qweight": _pack(q.reshape(n, k).t(), 1, AWQ_ORDER),
            "qzeros": _pack(zero.t(), 1, AWQ_ORDER),
            "scales": scale.t().half().contiguous()}, deq


def block_fp8(weight: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """weight e4m3 and weight_scale_inv per 128x128 block, and the dequantized weight."""
    n, k = weight.shape
    rows = -(-n // 128)
    padded = torch.zeros(rows * 128, k)
    padded[:n] = weight
    blocks = padded.reshape(rows, 128, k // 128, 128)
    scale = (blocks.abs().amax((1, 3)) / 448.0).clamp(min=1e-12)  # [rows, K/128]
    full = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    q = (weight / full).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale}, q.float() * full


def block_fp8_ue8m0(weight: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """block_fp8 with each block's scale rounded up to a power of two and stored as
    float8_e8m0fnu (scale_fmt "ue8m0", as DeepSeek-V3.2 and transformers write it)."""
    stored, _ = block_fp8(weight)
    scale = torch.exp2(torch.ceil(torch.log2(stored["weight_scale_inv"])))
    n = weight.shape[0]
    full = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    q = (weight / full).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale.to(torch.float8_e8m0fnu)}, q.float() * full


BLOCK_FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128]}
_GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
         "sym": True, "checkpoint_format": "gptq"}
CONFIGS = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
             "sym": True, "checkpoint_format": "gptq"},
    "gptq_act_order": {"quant_method": "gptq", "bits": 4, "group_size": GROUP,
                       "desc_act": True, "sym": True},
    "gptq_asym_v2": {**_GPTQ, "sym": False, "desc_act": True, "checkpoint_format": "gptq_v2"},
    "gptq_asym": {**_GPTQ, "sym": False},
    "gptq_channel": {**_GPTQ, "group_size": -1},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
            "version": "gemm"},
    "fp8_block": BLOCK_FP8_CONFIG,
    "fp8_block_ue8m0": {**BLOCK_FP8_CONFIG, "scale_fmt": "ue8m0"},
}
PACKERS = {"gptq": lambda w: gptq(w, False), "gptq_act_order": lambda w: gptq(w, True),
           "gptq_asym_v2": lambda w: gptq(w, True, sym=False, v2=True),
           "gptq_asym": lambda w: gptq(w, False, sym=False),
           "gptq_channel": lambda w: gptq(w, False, group=-1),
           "awq": awq, "fp8_block": block_fp8, "fp8_block_ue8m0": block_fp8_ue8m0}


def base_model(dtype=torch.float32, wide: bool = False):
    """The tiny random Llama (seeded; `wide`: TP_LLAMA's sizes) and its tokenizer."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    cfg = transformers.LlamaConfig(vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                   bos_token_id=None, **(TP_LLAMA if wide else LLAMA))
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval(), tok


def _linears(model):
    return [(name, mod) for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear) and name != "lm_head"]


def _save(model, tok, tensors: dict | None = None, qconfig: dict | None = None) -> Path:
    out = Path(tempfile.mkdtemp(prefix="cllm-quant-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if tensors is not None:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, "quantization_config": qconfig}))
    return out


@functools.cache
def packed_pair(kind: str, wide: bool = False) -> tuple[Path, Path]:
    """(quantized checkpoint, float32 checkpoint of its dequantized weights) for `kind`, of
    the TP_LLAMA model where `wide`."""
    if kind.startswith("ct_"):
        return compressed_tensors_pair(kind[3:], wide)
    if kind.startswith("fp8_tensor_"):
        return fp8_tensor_pair(kind == "fp8_tensor_static", wide)
    model, tok = base_model(wide=wide)
    tensors = dict(model.state_dict())
    for name, linear in _linears(model):
        stored, deq = PACKERS[kind](linear.weight.detach().float())
        del tensors[f"{name}.weight"]
        tensors.update({f"{name}.{key}": value for key, value in stored.items()})
        linear.weight.data.copy_(deq)
    tensors.pop("lm_head.weight", None) if model.config.tie_word_embeddings else None
    return _save(model, tok, tensors, CONFIGS[kind]), _save(model, tok)


# left in float32 by the per-tensor FP8 checkpoints, as AutoFP8 lists them
FP8_TENSOR_IGNORED = ["lm_head", "model.layers.1.mlp.down_proj"]


def tensor_fp8(weight: torch.Tensor, scalar: bool) -> tuple[dict, torch.Tensor]:
    """weight e4m3 with one weight_scale = amax / 448 (a 0-d tensor as AutoFP8 writes it, or
    shape [1]), and the dequantized weight."""
    scale = (weight.abs().amax() / 448.0).clamp(min=1e-12)
    q = (weight / scale).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": scale if scalar else scale.reshape(1)}, q.float() * scale


def _input_ranges(model, linears) -> dict[str, tuple[float, float]]:
    """Each linear's smallest and largest input over random token sequences (the calibration
    pass)."""
    ranges: dict[str, tuple[float, float]] = {}

    def observe(name):
        def hook(_, args):
            low, high = ranges.get(name, (0.0, 0.0))
            ranges[name] = (min(low, args[0].min().item()), max(high, args[0].max().item()))
        return hook

    hooks = [mod.register_forward_pre_hook(observe(name)) for name, mod in linears]
    tokens = torch.randint(1, model.config.vocab_size, (64, 64),
                           generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(tokens)
    for hook in hooks:
        hook.remove()
    return ranges


def fp8_tensor_pair(static: bool, wide: bool = False) -> tuple[Path, Path]:
    """quant_method fp8 without weight_block_size, as AutoFP8 writes it: per-tensor e4m3
    weights and, static, scalar scales with input_scale = amax / 448 from a calibration pass
    and self_attn k_scale / v_scale (kv_cache_scheme static); dynamic, [1] weight scales.
    FP8_TENSOR_IGNORED stay in float32. Next to its dequantized twin."""
    model, tok = base_model(wide=wide)
    linears = [(n, m) for n, m in _linears(model) if n not in FP8_TENSOR_IGNORED]
    ranges = _input_ranges(model, linears) if static else {}
    amax = {name: max(-low, high) for name, (low, high) in ranges.items()}
    tensors = dict(model.state_dict())
    for name, linear in linears:
        stored, deq = tensor_fp8(linear.weight.detach().float(), scalar=static)
        del tensors[f"{name}.weight"]
        tensors.update({f"{name}.{key}": value for key, value in stored.items()})
        if static:
            tensors[f"{name}.input_scale"] = torch.tensor(amax[name] / 448.0)
        linear.weight.data.copy_(deq)
    qconfig = {"quant_method": "fp8", "activation_scheme": "static" if static else "dynamic",
               "ignored_layers": FP8_TENSOR_IGNORED}
    if static:
        qconfig["kv_cache_scheme"] = "static"
        for layer in range(model.config.num_hidden_layers):
            for name in ("k_scale", "v_scale"):
                tensors[f"model.layers.{layer}.self_attn.{name}"] = torch.tensor(0.05)
    return _save(model, tok, tensors, qconfig), _save(model, tok)

def compressed_tensors_pair(preset: str, wide: bool = False) -> tuple[Path, Path]:
    """A compressed-tensors checkpoint of `preset` (W4A16, W4A16_ASYM, W4A16_CHANNEL: per
    channel, FP8_DYNAMIC, FP8, FP8_BLOCK, W8A8, W8A8_STATIC / W8A8_STATIC_ASYM: INT8 with static
    per-tensor activations) made by the library (weights calibrated min/max, static input
    scales set: INT8's from the inputs' range), and its dequantized twin."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    model, tok = base_model(wide=wide)
    reference = {}
    if preset == "act_order":  # hand-made: the library no longer writes it
        return ct_act_order_pair(wide)
    ranges = _input_ranges(model, _linears(model)) if "STATIC" in preset else {}
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": _scheme(preset)},
                                                        ignore=["lm_head"]))
    for name, mod in _linears(model):
        _calibrate(mod, ranges.get(name))
        zero = getattr(mod, "weight_zero_point", None)
        reference[name] = fake_quantize(mod.weight.detach(), mod.weight_scale, zero,
                                        mod.quantization_scheme.weights)
    fmt = ("pack-quantized" if preset.startswith("W4A16") else
           "int-quantized" if preset.startswith("W8A8") else "float-quantized")
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    quantized = _save(model, tok)
    compressor.update_config(str(quantized))
    plain, _ = base_model(wide=wide)
    for name, mod in _linears(plain):
        mod.weight.data.copy_(reference[name])
    return quantized, _save(plain, tok)


def _scheme(preset: str):
    """The library's preset scheme; W4A16 per channel; W8A8 (int8 per channel) with static
    per-tensor int8 activations, symmetric or (_ASYM) with an input zero point."""
    from compressed_tensors.quantization import QuantizationArgs, preset_name_to_scheme

    base = {"W4A16_CHANNEL": "W4A16"}.get(preset, preset.split("_STATIC")[0])
    scheme = preset_name_to_scheme(base, ["Linear"])
    if preset == "W4A16_CHANNEL":
        scheme.weights.strategy, scheme.weights.group_size = "channel", None
    if "STATIC" in preset:
        scheme.input_activations = QuantizationArgs(
            num_bits=8, type="int", strategy="tensor", dynamic=False,
            symmetric=not preset.endswith("ASYM"))
    return scheme


def _calibrate(mod, input_range: tuple[float, float] | None = None) -> None:
    """Min/max weight scales (what an observer computes) and a static input scale: from the
    observed input range (and a zero point, asymmetric) if given, else a fixed one."""
    from compressed_tensors.quantization.utils import calculate_qparams

    args, weight = mod.quantization_scheme.weights, mod.weight.detach()
    if args.strategy == "group":
        grouped = weight.reshape(weight.shape[0], -1, args.group_size)
        low, high = grouped.amin(-1), grouped.amax(-1)
    elif args.strategy == "block":  # zero padding leaves a block's largest |w| as it is
        rows, cols = (-(-size // 128) * 128 for size in weight.shape)
        padded = torch.nn.functional.pad(weight, (0, cols - weight.shape[1],
                                                  0, rows - weight.shape[0]))
        blocks = padded.reshape(rows // 128, 128, cols // 128, 128)
        low, high = blocks.amin((1, 3)), blocks.amax((1, 3))
    elif args.strategy == "channel":
        low, high = weight.amin(-1, keepdim=True), weight.amax(-1, keepdim=True)
    else:
        low, high = weight.amin().reshape(1), weight.amax().reshape(1)
    scale, zero = calculate_qparams(low, high, args)
    mod.weight_scale.data = scale.to(mod.weight_scale.dtype).reshape(mod.weight_scale.shape)
    if hasattr(mod, "weight_zero_point"):
        mod.weight_zero_point.data = zero.to(mod.weight_zero_point.dtype).reshape(
            mod.weight_zero_point.shape)
    if hasattr(mod, "input_scale") and input_range is not None:
        scale, zero = calculate_qparams(*(torch.tensor([v]) for v in input_range),
                                        mod.quantization_scheme.input_activations)
        mod.input_scale.data.copy_(scale.reshape(mod.input_scale.shape))
        if hasattr(mod, "input_zero_point"):
            mod.input_zero_point.data.copy_(zero.reshape(mod.input_zero_point.shape))
    elif hasattr(mod, "input_scale"):
        mod.input_scale.data.fill_(0.01)  # activations here are O(1): 448 * 0.01 covers them


def ct_act_order_pair(wide: bool = False) -> tuple[Path, Path]:
    """compressed-tensors W4A16 with activation order `group`, as its library wrote it before
    removing it (weight_g_idx [K] beside weight_packed [N, K/8] in input order, weight_scale
    [N, groups]): the GPTQ act-order packer's values, repacked along K."""
    from compiled_llm.quantization.packing import pack_int4, unpack_int4

    model, tok = base_model(wide=wide)
    tensors = dict(model.state_dict())
    for name, linear in _linears(model):
        stored, deq = gptq(linear.weight.detach().float(), True)
        values = unpack_int4(stored["qweight"].t().contiguous())  # [N, K], offset by 8
        del tensors[f"{name}.weight"]
        tensors.update({f"{name}.weight_packed": pack_int4(values),
                        f"{name}.weight_scale": stored["scales"].t().float().contiguous(),
                        f"{name}.weight_shape": torch.tensor(linear.weight.shape),
                        f"{name}.weight_g_idx": stored["g_idx"]})
        linear.weight.data.copy_(deq)
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
               "group_size": GROUP, "dynamic": False, "actorder": "group"}
    qconfig = {"quant_method": "compressed-tensors", "format": "pack-quantized",
               "ignore": ["lm_head"], "quantization_status": "compressed",
               "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                             "input_activations": None}}}
    return _save(model, tok, tensors, qconfig), _save(model, tok)


QWEN3_MOE = dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                 max_position_embeddings=512)
# each rank's experts, k / v rows and o_proj inputs whole 128-blocks at tensor_parallel_size 2
QWEN3_MOE_TP = dict(QWEN3_MOE, hidden_size=256, head_dim=128, moe_intermediate_size=256,
                    intermediate_size=512)
# what Qwen3-MoE-FP8 checkpoints store in block FP8: attention and every expert's projections;
# the routers (mlp.gate), norms, embeddings and the LM head stay in the model's dtype
_FP8_MOE_LINEAR = re.compile(r"(self_attn\.[qkvo]_proj|experts\.\d+\.(gate|up|down)_proj)\.weight$")


@functools.cache
def fp8_moe_pair(wide: bool = False) -> tuple[Path, Path]:
    """(block-FP8 Qwen3-MoE checkpoint in the published per-expert layout, float32 checkpoint
    of its dequantized weights), both from one tiny random transformers model (`wide`: of
    QWEN3_MOE_TP's sizes)."""
    import transformers
    from safetensors.torch import load_file, save_file

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    cfg = transformers.Qwen3MoeConfig(vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                      bos_token_id=None, **(QWEN3_MOE_TP if wide else QWEN3_MOE))
    torch.manual_seed(0)
    reference = _save(transformers.AutoModelForCausalLM.from_config(cfg).eval(), tok)
    plain = load_file(str(reference / "model.safetensors"))
    quantized = {}
    for name, tensor in plain.items():
        if _FP8_MOE_LINEAR.search(name) is None:
            quantized[name] = tensor
            continue
        stored, deq = block_fp8(tensor.float())
        plain[name] = deq
        quantized.update({f"{name[: -len('weight')]}{key}": value
                          for key, value in stored.items()})
    save_file(plain, str(reference / "model.safetensors"), metadata={"format": "pt"})
    quantized_dir = Path(tempfile.mkdtemp(prefix="cllm-fp8-moe-"))
    for path in reference.iterdir():
        shutil.copy(path, quantized_dir / path.name)
    save_file(quantized, str(quantized_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((quantized_dir / "config.json").read_text())
    qconfig = {**BLOCK_FP8_CONFIG, "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate",
                                                              "model.layers.1.mlp.gate"]}
    config["quantization_config"] = qconfig
    (quantized_dir / "config.json").write_text(json.dumps(config))
    return quantized_dir, reference
