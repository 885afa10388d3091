"""ModelConfigView: what an engine's model_config answers. vLLM's ModelConfig names (model,
tokenizer, dtype, max_model_len, hf_config, runner_type, get_vocab_size() ...) come from the
engine's own state; any other name from the loaded model's config (a DecoderConfig:
vocab_size, num_hidden_layers, head_dim ...), so code written for either keeps working."""

from __future__ import annotations

import functools
from typing import Any

import torch

from compiled_llm.config import EngineArgs
from compiled_llm.engine.core_spec import DEMO_MODEL
from compiled_llm.parallel_config import shown_model_name
from compiled_llm.worker.loader import load_hf_config

# EngineArgs fields vLLM's ModelConfig has under the same name and meaning, read as they are
ARGS_FIELDS = ("seed", "tokenizer_mode", "trust_remote_code", "revision", "tokenizer_revision",
               "enforce_eager", "max_logprobs", "logprobs_mode", "skip_tokenizer_init",
               "generation_config", "runner", "convert", "task")
# where vLLM's get_total_num_kv_heads and get_num_experts look in an HF config, in its order
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")


class ModelConfigView:
    """vLLM's ModelConfig over one engine, read-only: setting an attribute raises
    AttributeError. Invariant: it holds values and configs, never the engine (dropping the
    engine frees it). A name vLLM's ModelConfig lacks is the model config's (its hidden_size
    and architecture mean what vLLM's do); the get_* shape methods follow vLLM's rules on the
    checkpoint's transformers config (hf_text_config), loaded at their first use."""

    def __init__(self, args: EngineArgs, model_config: Any, *, max_model_len: int,
                 dtype: torch.dtype, runner_type: str,
                 sampling_defaults: dict[str, Any] | None = None) -> None:
        """model_config: the loaded model's config; max_model_len and dtype as the engine
        settled them; sampling_defaults: the generation-config defaults requests start from."""
        state = self.__dict__
        state["_args"] = args
        state["_model_config"] = model_config
        state["_max_model_len"] = int(max_model_len)
        state["_dtype"] = dtype
        state["_runner_type"] = runner_type
        state["_sampling_defaults"] = dict(sampling_defaults or {})

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"model_config is read-only (setting {name!r}): configure the "
                             "engine through EngineArgs")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"model_config is read-only (deleting {name!r})")

    def __getattr__(self, name: str) -> Any:
        state = self.__dict__
        if name.startswith("__") or "_model_config" not in state:
            raise AttributeError(name)
        if name in ARGS_FIELDS:
            return getattr(state["_args"], name)
        model_config = state["_model_config"]
        try:
            return getattr(model_config, name)
        except AttributeError:
            raise AttributeError(f"model_config has no attribute {name!r} (neither vLLM's "
                                 f"ModelConfig names it here nor {type(model_config).__name__})"
                                 ) from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *ARGS_FIELDS, *dir(self._model_config)})

    def __repr__(self) -> str:
        return (f"ModelConfigView(model={self.model!r}, dtype={self.dtype}, "
                f"max_model_len={self.max_model_len}, runner_type={self.runner_type!r})")

    # ------------------------------------------------------------------ vLLM's fields
    @property
    def model(self) -> str:
        """The model directory the engine loaded."""
        return str(self._args.model or DEMO_MODEL)

    @property
    def tokenizer(self) -> str:
        """The tokenizer's directory: EngineArgs.tokenizer, else the model's (as vLLM)."""
        return self._args.tokenizer or self.model

    @property
    def served_model_name(self) -> str:
        """The name the model is served under: the model's as given (a Hub id for a model
        loaded by its id), as vLLM's when none is given."""
        return shown_model_name(self.model)

    @property
    def max_model_len(self) -> int:
        """The longest sequence, prompt plus output, as the engine settled it (an int)."""
        return self._max_model_len

    @property
    def dtype(self) -> torch.dtype:
        """The weights' and activations' dtype the engine runs in (a torch.dtype)."""
        return self._dtype

    @property
    def runner_type(self) -> str:
        """"generate" or "pooling": the runner the engine resolved (never "auto")."""
        return self._runner_type

    @property
    def quantization(self) -> str | None:
        """EngineArgs.quantization, else the checkpoint's format as the loader detected it
        (as vLLM resolves it)."""
        if self._args.quantization is not None:
            return self._args.quantization
        from compiled_llm.quantization.loading import detect_format

        found = detect_format(load_hf_config(self.model), None)
        return None if found is None else found.name

    @property
    def override_generation_config(self) -> dict[str, Any]:
        """EngineArgs.override_generation_config ({} when unset, as vLLM's default)."""
        return dict(self._args.override_generation_config or {})

    @functools.cached_property
    def hf_config(self):
        """The checkpoint's transformers config (AutoConfig; for an architecture transformers
        does not know, a PretrainedConfig of its config.json). Never runs checkpoint code."""
        from transformers import AutoConfig, PretrainedConfig

        try:
            return AutoConfig.from_pretrained(self.model, trust_remote_code=False)
        except (ValueError, KeyError):
            return PretrainedConfig.from_dict(load_hf_config(self.model))

    @property
    def hf_text_config(self):
        """The text model's config: hf_config itself for a text-only model, its text_config
        for an image-text-to-text one (served on its text stack alone)."""
        return self.hf_config.get_text_config()

    @property
    def architectures(self) -> list[str]:
        """config.json's architectures."""
        return list(getattr(self.hf_config, "architectures", None) or [])

    @property
    def is_multimodal_model(self) -> bool:
        """False: the engine serves text-only models."""
        return False

    @property
    def is_encoder_decoder(self) -> bool:
        """False: the engine serves no encoder-decoder models."""
        return False

    # ------------------------------------------------------------------ vLLM's getters
    def get_vocab_size(self) -> int:
        """hf_text_config.vocab_size (0 if absent), as vLLM's."""
        return getattr(self.hf_text_config, "vocab_size", 0)

    def get_hidden_size(self) -> int:
        """hf_text_config.hidden_size (0 if absent), as vLLM's."""
        return getattr(self.hf_text_config, "hidden_size", 0)

    def get_head_size(self) -> int:
        """One attention head's size: head_dim where the config sets it, else
        hidden_size_per_head, else hidden_size // num_attention_heads (vLLM's rule)."""
        text = self.hf_text_config
        for key in ("head_dim", "hidden_size_per_head"):
            if getattr(text, key, None) is not None:
                return getattr(text, key)
        return text.hidden_size // text.num_attention_heads

    def get_total_num_kv_heads(self) -> int:
        """KV heads of the whole model: 1 for multi-query attention, else the first of
        vLLM's KV-head keys the config sets, else num_attention_heads."""
        text = self.hf_text_config
        if getattr(text, "multi_query", False):
            return 1
        for key in KV_HEAD_KEYS:
            if getattr(text, key, None) is not None:
                return getattr(text, key)
        return text.num_attention_heads

    def get_num_kv_heads(self, parallel_config: Any = None) -> int:
        """KV heads per tensor-parallel rank, at least 1 (replicated when fewer than ranks);
        parallel_config: anything with tensor_parallel_size (None: the engine's args)."""
        tp = _parallel(parallel_config, self._args).tensor_parallel_size
        return max(1, self.get_total_num_kv_heads() // tp)

    def get_num_attention_heads(self, parallel_config: Any = None) -> int:
        """Query heads per tensor-parallel rank (None: the engine's args)."""
        tp = _parallel(parallel_config, self._args).tensor_parallel_size
        return getattr(self.hf_text_config, "num_attention_heads", 0) // tp

    def get_total_num_hidden_layers(self) -> int:
        """The decoder's layers in all (hf_text_config.num_hidden_layers, 0 if absent)."""
        return getattr(self.hf_text_config, "num_hidden_layers", 0)

    def get_layers_start_end_indices(self, parallel_config: Any = None) -> tuple[int, int]:
        """[start, end) of the layers of parallel_config.rank's pipeline stage (rank 0 if
        it has none; None: the engine's args), split as vLLM splits them (its
        VLLM_PP_LAYER_PARTITION included)."""
        from compiled_llm.distributed.pipeline_parallel import layer_partition

        config = _parallel(parallel_config, self._args)
        pp, tp = config.pipeline_parallel_size, config.tensor_parallel_size
        stage = (getattr(config, "rank", 0) // tp) % pp
        parts = layer_partition(self.get_total_num_hidden_layers(), pp)
        start = sum(parts[:stage])
        return start, start + parts[stage]

    def get_num_layers(self, parallel_config: Any = None) -> int:
        """Layers of one pipeline stage (all of them without pipeline parallelism);
        parallel_config as get_layers_start_end_indices takes it."""
        start, end = self.get_layers_start_end_indices(parallel_config)
        return end - start

    def get_sliding_window(self) -> int | None:
        """hf_text_config.sliding_window (None without one), as vLLM's."""
        return getattr(self.hf_text_config, "sliding_window", None)

    def get_num_experts(self) -> int:
        """Experts per mixture-of-experts layer (0 for a dense model), as vLLM reads them."""
        text = self.hf_text_config
        experts = next((getattr(text, key) for key in EXPERT_KEYS
                        if getattr(text, key, None) is not None), 0)
        return experts[0] if isinstance(experts, list) else experts or 0

    def is_model_moe(self) -> bool:
        """Whether the model has mixture-of-experts layers (more than one expert)."""
        return self.get_num_experts() > 1

    def is_quantized(self) -> bool:
        """Whether the checkpoint is quantized (config.json has a quantization_config)."""
        return getattr(self.hf_config, "quantization_config", None) is not None

    def get_diff_sampling_param(self) -> dict[str, Any]:
        """The sampling defaults from the generation config and its overrides (max_new_tokens
        as max_tokens), as vLLM's; {} with generation_config="vllm" and no overrides."""
        return dict(self._sampling_defaults)


def _parallel(parallel_config: Any, args: EngineArgs) -> Any:
    """parallel_config, or the engine's args (which carry its parallel sizes) for None."""
    return args if parallel_config is None else parallel_config
