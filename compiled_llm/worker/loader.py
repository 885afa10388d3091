"""Weight loading from an HF model directory: config, safetensors (sharded), generation config.

Pickle `.bin` checkpoints are refused unless the caller names load_format="pt". Every parameter
must be filled with a tensor of the right shape; errors name the tensor and the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compiled_llm.config import model_len_bounds
from compiled_llm.distributed.expert_parallel import expert_parallel_names, keep_dispatchers
from compiled_llm.distributed.pipeline_parallel import (
    build_stage,
    localize_kv_scales,
    rank_stage,
)
from compiled_llm.distributed.shards import plan_index, read_index
from compiled_llm.distributed.tensor_parallel import build_sharded
from compiled_llm.models import DecoderConfig, ModelRegistry
from compiled_llm.models.layers import cast_model
from compiled_llm.models.multimodal import text_stack_config
from compiled_llm.models.plugins import load_general_plugins
from compiled_llm.worker.kv_cache import IGNORED_ATTENTION_SCALES, kv_scale_key


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in path, or {} when the file does not exist."""
    return json.loads(path.read_text()) if path.exists() else {}


def load_hf_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    """model_dir's config.json as a dict; ValueError naming the model when it is missing. A
    file transformers did not write (no transformers_version) has the keys it leaves out
    filled as its transformers class fills them (as vLLM reads it); one it wrote has them
    all, and is read without importing transformers (an engine core never does). An
    image-text-to-text checkpoint reads as its text model's config (models/multimodal.py)."""
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise ValueError(f"model: no config.json in {model_dir!s}")
    written = read_json(path)
    if "transformers_version" not in written:
        written = {**_class_defaults(model_dir, written), **written}
    return text_stack_config(written, model_dir)


def _class_defaults(model_dir: str | os.PathLike, written: dict[str, Any]) -> dict[str, Any]:
    """The model-specific keys config.json leaves out, valued as transformers' config class
    derives them (Qwen3's num_key_value_heads and max_position_embeddings, Mixtral's experts);
    {} for a model_type transformers does not know. Never runs checkpoint code."""
    from transformers import AutoConfig, PretrainedConfig

    try:
        full = AutoConfig.from_pretrained(model_dir, trust_remote_code=False).to_dict()
    except Exception:  # best effort: a config transformers rejects is read as written
        return {}
    generic = PretrainedConfig().to_dict()
    return {key: value for key, value in full.items() if key not in generic and key not in written}


def build_model_config(hf_config: dict[str, Any]) -> tuple[type[nn.Module], DecoderConfig]:
    """Resolve the architecture (after the plugins have registered theirs) and read its config
    (ValueError on an unknown one); a model class may name its own `config_cls`, and in
    `hf_unread` the config.json keys its transformers class never reads (dropped here)."""
    load_general_plugins()
    model_cls = ModelRegistry.resolve_model_cls(hf_config.get("architectures") or [])
    if hasattr(model_cls, "text_model_cls"):  # an image-text-to-text checkpoint's text stack
        model_cls = model_cls.text_model_cls(hf_config, ModelRegistry.resolve_model_cls)
    config_cls = getattr(model_cls, "config_cls", DecoderConfig)
    return model_cls, config_cls.from_hf(read_keys(model_cls, hf_config),
                                         **model_cls.hf_defaults)


def read_keys(model_cls: type, hf_config: dict[str, Any]) -> dict[str, Any]:
    """hf_config less the keys in model_cls.hf_unread. A sliding_window among them, shorter
    than the model, is refused for generation: transformers' model attends to every position
    in a forward pass, yet its generate cache keeps only the last sliding_window tokens."""
    unread = getattr(model_cls, "hf_unread", ())
    window = hf_config.get("sliding_window")
    if ("sliding_window" in unread and window is not None
            and not getattr(model_cls, "is_pooling_model", False)
            and window < model_len_bounds(hf_config)[0]):
        raise ValueError(f"sliding_window {window!r} is not supported for {model_cls.__name__}"
                         " (transformers' forward pass ignores it, its generate cache does not)")
    return {key: value for key, value in hf_config.items() if key not in unread}


def checkpoint_files(model_dir: Path, load_format: str) -> list[Path]:
    """The weight files to read, sharded through the index file when there is one: `auto`
    takes safetensors, else pickle `.bin` files (read with torch's weights-only unpickler, as
    vLLM does); `safetensors` refuses `.bin`; `pt` takes `.bin` first."""
    if load_format not in ("auto", "safetensors", "pt"):
        raise ValueError(f"load_format must be auto, safetensors or pt, got {load_format!r}")
    kinds = [(".safetensors", "model.safetensors.index.json"),
             (".bin", "pytorch_model.bin.index.json")]
    for ext, index in kinds[::-1] if load_format == "pt" else kinds:
        files = _files_with(model_dir, ext, index)
        if not files:
            continue
        if ext == ".bin" and load_format == "safetensors":
            raise ValueError(f'load_format="safetensors": {model_dir} holds only pickle .bin '
                             'weights; pass load_format="auto" or "pt" to read them')
        return files
    raise ValueError(f"model: no .safetensors or .bin weights found in {model_dir}")


# files HF's Trainer saves beside the weights, which vLLM's loader skips too
NOT_WEIGHTS = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt",
               "scaler.pt")


def _files_with(model_dir: Path, ext: str, index_name: str) -> list[Path]:
    index = model_dir / index_name
    if index.exists():
        names = sorted(set(read_json(index)["weight_map"].values()))
        return [model_dir / name for name in names]
    return sorted(path for path in model_dir.glob(f"*{ext}") if path.name not in NOT_WEIGHTS)


def pinned_load_enabled() -> bool:
    """Whether whole safetensors files go to CUDA through pinned staging buffers: the default
    (Llama-3-8B shape, H200: load_model 0.61 s against 3.04 s); COMPILED_LLM_PINNED_LOAD=0
    keeps safetensors' own per-tensor reads."""
    return os.environ.get("COMPILED_LLM_PINNED_LOAD", "1") != "0"


def iter_tensors(files: list[Path], device: torch.device | None = None, index_of=None):
    """Yield (name, tensor, file) over every tensor in the checkpoint files; safetensors files
    are read straight onto `device` where it is CUDA, whole files through pinned staging
    buffers (worker/weight_reader.py). Where `index_of(name)` gives an index, only that slice
    is read (a tensor-parallel shard), through safetensors' own slicing."""
    target = str(device) if device is not None and device.type == "cuda" else "cpu"
    if (target != "cpu" and index_of is None and pinned_load_enabled()
            and all(path.suffix == ".safetensors" for path in files)):
        from compiled_llm.worker.weight_reader import dtypes_supported, iter_safetensors

        if dtypes_supported(files):  # a dtype it does not map (FP4, FP6): safetensors' reads
            yield from iter_safetensors(files, device)
            return
    for path in files:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt", device=target) as reader:
                for name in reader.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    index = index_of(name) if index_of is not None else None
                    yield name, (reader.get_tensor(name) if index is None
                                 else read_index(reader.get_slice(name), index)), path
        else:
            for name, tensor in torch.load(path, map_location="cpu", weights_only=True).items():
                index = index_of(name) if index_of is not None else None
                yield name, (tensor if index is None
                             else read_index(tensor, index).contiguous()), path


def load_weights(model: nn.Module, files: list[Path], device: torch.device | None = None,
                 plan=None, transform=None) -> None:
    """Copy checkpoint tensors (read onto `device` where it is CUDA) into model parameters;
    every parameter must be loaded whole. A tensor-parallel `plan` names the slice of each
    checkpoint tensor this rank reads (distributed/tensor_parallel.py).

    `model.weight_name` maps a checkpoint name to a parameter name, to None (skip), or to a
    target with `.name` and `.select(param)` (the part of a stacked parameter it fills: one
    expert's gate rows of w13, say) and, optionally, `.prepare(tensor)` (the checkpoint tensor
    reordered to fit it); the parts of a parameter must add up to all of it. `transform` maps
    the stream of (name, tensor, path) first (a format dequantized at load)."""
    params = dict(model.named_parameters())  # tied weights appear once
    loaded: dict[str, int] = {}  # parameter name -> elements filled so far
    model.checkpoint_kv_scales = {}  # layer -> {0: K's scale, 1: V's}: FP8 KV caches read it
    index_of = None if plan is None else plan_index(model, plan)
    stream = iter_tensors(files, device, index_of)
    for name, tensor, path in transform(stream) if transform else stream:
        if take_kv_scale(model.checkpoint_kv_scales, name, tensor):
            continue
        target = model.weight_name(name)
        if target is None:
            continue
        ours = target if isinstance(target, str) else target.name
        if ours not in params:
            if ours == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            raise ValueError(f"{path.name}: tensor {name!r} matches no parameter of the model")
        dest = params[ours] if isinstance(target, str) else target.select(params[ours])
        if hasattr(target, "prepare"):
            tensor = target.prepare(tensor)
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ValueError(
                f"{path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(dest.shape)}"
            )
        with torch.no_grad():
            dest.copy_(tensor)
        loaded[ours] = loaded.get(ours, 0) + dest.numel()
    missing = sorted(name for name, param in params.items()
                     if loaded.get(name, 0) != param.numel())
    missing = _zero_absent(model, params, loaded, missing)
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {missing[:8]}")


def _zero_absent(model: nn.Module, params: dict[str, nn.Parameter], loaded: dict[str, int],
                 missing: list[str]) -> list[str]:
    """Zero the wholly absent parameters the model class allows to be (names ending in one of
    its `zero_when_absent`: a router's correction bias some releases leave out, which
    transformers then initialises to zeros); the rest of `missing`."""
    optional = tuple(getattr(model, "zero_when_absent", ()))
    absent = [name for name in missing if optional and name.endswith(optional)
              and not loaded.get(name)]
    with torch.no_grad():
        for name in absent:
            params[name].zero_()
    return [name for name in missing if name not in absent]


def take_kv_scale(scales: dict[int, dict[int, torch.Tensor]], name: str,
                  tensor: torch.Tensor) -> bool:
    """Keep a KV-cache (or unused attention) scale tensor aside; False for any other tensor."""
    key = kv_scale_key(name)
    if key is not None:
        for which in key[1]:
            scales.setdefault(key[0], {})[which] = tensor.detach().float().cpu()
    return key is not None or IGNORED_ATTENTION_SCALES.search(name) is not None


def resolve_dtype(dtype: str | torch.dtype, hf_config: dict[str, Any], device: torch.device):
    """'auto' takes the checkpoint's dtype (float32 if absent); a float16 checkpoint runs in
    float32 on CPU: CPUs without native float16 run its matmuls 5-15x slower than float32 or
    bfloat16, and bfloat16 (vLLM's CPU choice) lands ~10x further from transformers' float16
    logprobs than float32 does."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        name = hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32"
        out = getattr(torch, name)
        return torch.float32 if out == torch.float16 and device.type == "cpu" else out
    names = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "half": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype must be auto or one of {sorted(names)}, got {dtype!r}")
    return names[dtype]


def load_model(model_dir: str | os.PathLike, dtype: torch.dtype, device: torch.device,
               max_len: int, load_format: str = "auto",
               quantization: str | None = None, tp=None,
               pipeline_parallel_size: int = 1,
               expert_parallel: bool = False) -> nn.Module:
    """Build the model for the checkpoint in model_dir on device, in dtype, with weights; a
    quantized checkpoint (config.json's quantization_config) gets its format's linears
    (quantization/loading.py), else the load-time `quantization` transform (None or "fp8")
    runs; then sibling linears' weights are laid out as one fused tensor each
    (worker/fuse_weights.py). With a tensor-parallel group `tp`, this rank's shard is built
    and only its slices are read (whole experts per rank with expert_parallel); with several
    pipeline stages, `tp`'s pipeline rank names the stage this rank builds (and, with several
    tensor-parallel ranks per stage, its shard of it), and only its layers are read.
    `model.load_seconds` times its phases: build (config and modules), read, prepare."""
    from compiled_llm.distributed.quant_shards import quantize_row_parallel
    from compiled_llm.quantization.fp8 import quantize_model

    started = time.perf_counter()
    hf_config = load_hf_config(model_dir)
    model_cls, model_config = build_model_config(hf_config)
    checkpoint_format, quantization, transform = _checkpoint_format(hf_config, quantization)
    files = checkpoint_files(Path(model_dir), load_format)
    plan, stage = None, None
    if pipeline_parallel_size > 1:
        stage = rank_stage(tp.pipeline_rank, pipeline_parallel_size,
                           model_config.num_hidden_layers, tp.rank, tp.world_size)
    if stage is not None and checkpoint_format:
        raise ValueError("pipeline_parallel_size > 1 with a quantized checkpoint "
                         f"({checkpoint_format.name}) is not supported yet")
    if stage is not None:
        model, plan = build_stage(model_cls, model_config, max_len, device, dtype, stage, tp,
                                  expert_parallel)
    elif tp is not None:
        model, plan = build_sharded(model_cls, model_config, max_len, device, dtype, tp,
                                    expert_parallel)
    else:
        with torch.device(device), _default_dtype(dtype):  # no float32 copy first
            model = model_cls(model_config, max_len=max_len)
        cast_model(model, dtype)  # routers' float32_params stay float32
    built = time.perf_counter()
    dispatchers = expert_parallel_names(model)  # experts the formats may swap keep them
    finalize = _prepare_checkpoint(model, checkpoint_format, files, plan, tp, hf_config)
    load_weights(model, files, device, plan, transform)
    score_from_tokens(model, model_dir, tp)
    read = _synchronized(device)
    if stage is not None:
        localize_kv_scales(model)
    if plan is not None and quantization and not finalize:
        quantize_row_parallel(model, tp)  # o_proj / down_proj: FP8 shards, all-reduced
    model = finalize() if finalize else quantize_model(model, quantization)
    _prepare_to_run(model, dispatchers, device)
    model.load_seconds = {"build": built - started, "read": read - built,
                          "prepare": _synchronized(device) - read}
    return model.eval().requires_grad_(False)


def _prepare_to_run(model: nn.Module, dispatchers, device: torch.device) -> None:
    """After the weights: experts keep their dispatch, sibling weights fuse, tinygemm packs,
    shared experts overlap the routed ones (CUDA)."""
    from compiled_llm.quantization.w4a16 import prepare_tinygemm
    from compiled_llm.worker.fuse_weights import fuse_sibling_weights
    from compiled_llm.worker.shared_overlap import overlap_shared_experts, shared_overlap_enabled

    keep_dispatchers(model, dispatchers)
    fuse_sibling_weights(model)
    prepare_tinygemm(model)  # after the fusion: one packed tinygemm weight per fused weight
    if device.type == "cuda" and shared_overlap_enabled():  # routed experts on a side stream
        overlap_shared_experts(model)


def score_from_tokens(model: nn.Module, model_dir: str | os.PathLike, tp) -> None:
    """A classifier made from a causal LM (classifier_from_token): its tokens' ids from the
    model's tokenizer, their lm_head rows into score; ValueError for a token not in the
    vocabulary, or under tensor parallelism (the rows sit on other ranks)."""
    tokens = getattr(getattr(model, "config", None), "classifier_from_token", ())
    if not tokens:
        return
    if tp is not None:
        raise ValueError("classifier_from_token is not supported with tensor_parallel_size > 1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = [tokenizer.convert_tokens_to_ids(token) for token in tokens]
    unknown = [t for t, i in zip(tokens, ids) if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise ValueError(f"classifier_from_token: {unknown} not in the tokenizer's vocabulary")
    model.score_from_token_rows(ids)


def _prepare_checkpoint(model: nn.Module, checkpoint_format, files: list[Path], plan, tp,
                        hf_config: dict[str, Any]):
    """Swap a quantized checkpoint's linears before loading (on a tensor-parallel shard, with
    the plan rewritten for each stored tensor: distributed/quant_shards.py); the step that
    converts them afterwards, or None without a checkpoint format."""
    from compiled_llm.distributed.quant_shards import act_order, prepare_sharded
    from compiled_llm.quantization.loading import prepare_quantized

    if not checkpoint_format:
        return None
    if plan is None:
        return prepare_quantized(model, checkpoint_format, files)
    return prepare_sharded(model, checkpoint_format, files, plan, tp, act_order(hf_config))


def _checkpoint_format(hf_config: dict[str, Any], quantization: str | None):
    """(the checkpoint's format, whose linears are swapped, or None; the load-time
    quantization; a transform of the tensor stream or None): a format dequantized as it is
    read (MXFP4) loads as an unquantized checkpoint."""
    from compiled_llm.quantization.fp8 import check_quantization
    from compiled_llm.quantization.loading import detect_format

    checkpoint_format = detect_format(hf_config, quantization)
    if checkpoint_format is None:
        check_quantization(quantization)
        return None, quantization, None
    if checkpoint_format.dequantizes_at_load:
        return None, None, checkpoint_format.tensor_stream
    return checkpoint_format, quantization, None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Parameters made inside are `dtype` from the start (their values are overwritten by the
    checkpoint; buffers that ask for float32 keep it until the model's .to(dtype))."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point else previous)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _synchronized(device: torch.device) -> float:
    """perf_counter once `device`'s queued work is done (the phase times are the device's)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
