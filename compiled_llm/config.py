"""Engine configuration dataclasses: cache, scheduler and compile settings in one place.

The string under each field is its documentation (read by `config_docs`, the help of its
`compiled-llm` flag); a field typed with a Literal takes only those values."""

from __future__ import annotations

import math
import os
import typing
from dataclasses import dataclass, field
from typing import Literal

from compiled_llm.config_fields import (  # noqa: F401 (re-exported)
    attention_backend_for,
    check_choices,
    check_minimums,
    config_docs,
    field_choices,
    hf_rope_dict,
    max_model_len_arg,
    model_len_bounds,
    normalize_max_model_len,
    split_optional,
)
from compiled_llm.lora.config import LoRAArgs
from compiled_llm.optimization import (
    AUTOTUNE_OPTIONS,
    PERFORMANCE_MODES,
    CompilationConfig,  # noqa: F401  (vLLM's vllm.config.CompilationConfig)
    OptimizationLevel,
    PerformanceMode,
    apply_compilation_config,
    compilation_config_arg,
    level_defaults,
    mode_graph_sizes,
)
from compiled_llm.parallel_config import ParallelArgs, ParityArgs
from compiled_llm.speculative import check_speculative

ENV_KV_BYTES = "COMPILED_LLM_KV_CACHE_MEMORY_BYTES"  # default KV budget, CPU and GPU alike
# the one list of each field's allowed values: validation and the CLI's choices read these
CompileMode = Literal["backend", "stock", "none"]
CUDAGraphMode = Literal["none", "piecewise", "full", "full_and_piecewise"]
AttentionBackendName = Literal["auto", "torch", "triton"]
SchedulerPolicy = Literal["fcfs", "priority"]
PrefixCachingHashAlgo = Literal["xxhash", "sha256"]
LoadFormat = Literal["auto", "safetensors", "pt"]
QuantizationMethods = Literal["fp8", "gptq", "awq", "compressed-tensors", "gptq_marlin",
                              "awq_marlin"]
KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]

COMPILE_MODES: tuple[str, ...] = typing.get_args(CompileMode)
CUDAGRAPH_MODES: tuple[str, ...] = typing.get_args(CUDAGraphMode)
ATTENTION_BACKENDS: tuple[str, ...] = typing.get_args(AttentionBackendName)
SCHEDULER_POLICIES: tuple[str, ...] = typing.get_args(SchedulerPolicy)
PREFIX_CACHING_HASH_ALGOS: tuple[str, ...] = typing.get_args(PrefixCachingHashAlgo)
LOAD_FORMATS: tuple[str, ...] = typing.get_args(LoadFormat)
QUANTIZATION_METHODS: tuple[str, ...] = typing.get_args(QuantizationMethods)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


# the per-request bounds among EngineArgs' fields, and their smallest values
_REQUEST_LIMITS = {"max_logprobs": -1, "max_n_sequences": 1, "max_prompt_bytes": 1,
                   "max_stop_strings": 0, "max_stop_string_chars": 1,
                   "structured_outputs_max_bytes": 1, "structured_outputs_timeout_s": 0.001,
                   "max_cudagraph_capture_size": 1}


@dataclass
class CacheConfig:
    """How the KV cache is laid out and how much memory it may take."""

    block_size: int = 16
    """Tokens per KV-cache block (a power of two)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the GPU's memory this engine may use: weights, activations and KV cache."""
    kv_cache_memory_bytes: int | None = None
    """KV-cache budget in bytes: the budget on CPU (1 GiB if unset), and on GPU an override
    of gpu_memory_utilization."""
    num_gpu_blocks_override: int | None = None
    """Allocate exactly this many KV blocks, whatever the memory budget."""
    cache_dtype: KVCacheDtype = "auto"
    """The KV cache's dtype: auto (the model's) or FP8 (fp8 = fp8_e4m3, or fp8_e5m2)."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


@dataclass
class SchedulerConfig:
    """What the scheduler may put in one step, and in what order it admits requests."""

    max_num_seqs: int = 256
    """Most sequences in one step."""
    max_num_batched_tokens: int = 8192
    """Most tokens (prefill and decode together) in one step."""
    max_model_len: int = 2048
    """Longest sequence, prompt plus output, in tokens (the engine settles it from the model
    and the KV cache's size)."""
    enable_chunked_prefill: bool = True
    """Split long prompts over several steps so prefill shares steps with decode."""
    scheduling_policy: SchedulerPolicy = "fcfs"
    """fcfs: first come, first served; priority: the lowest request priority value first."""
    max_decode_slowdown: float | None = None
    """With requests decoding, cap a step's prefill tokens so the step lasts at most this many
    times a decode-only step (both learned from the steps run); None: no cap."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.max_decode_slowdown is not None and not 1 < self.max_decode_slowdown < math.inf:
            raise ValueError(f"max_decode_slowdown must be > 1 and finite, got "
                             f"{self.max_decode_slowdown}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len without chunked prefill"
            )


@dataclass
class CompileConfig:
    """How the model is compiled: `mode` is "backend" (ours: piecewise, passes, cache),
    "stock" (plain torch.compile with Inductor) or "none" (eager)."""

    mode: CompileMode = "backend"
    """backend: compiled-llm's torch.compile backend; stock: torch.compile with Inductor;
    none: eager."""
    dynamic_tokens: bool = True
    """Compile with the token count dynamic, so one graph serves every step size."""
    cache_dir: str | None = None
    """Compile cache directory (default: $COMPILED_LLM_CACHE_DIR or ~/.cache/compiled_llm)."""
    use_cache: bool = True
    """Read and write the compile cache."""
    dump_dir: str | None = None
    """Write the graphs before and after each pass, and Inductor's code, per piece here
    (default: $COMPILED_LLM_DUMP_DIR)."""
    passes: dict = field(default_factory=dict)
    """PassConfig overrides, e.g. {"enable_silu_mul": false}."""
    cudagraph_mode: CUDAGraphMode = "full_and_piecewise"
    """Which CUDA graphs to capture: none, piecewise (per compiled piece), full (whole decode
    steps) or both."""
    cudagraph_batch_sizes: list[int] | None = None
    """Batch sizes to capture full CUDA graphs for (default: 1, 2, 4, 8, 16, 24, 32, then
    every 16 up to max_num_seqs)."""
    piecewise_max_tokens: int = 512
    """Largest token count that gets piecewise CUDA graphs."""
    max_autotune: bool = False
    """Let Inductor autotune GEMMs (Triton templates against ATen) when compiling."""

    def inductor_options(self) -> dict:
        """Inductor config patches for every compiled piece."""
        return dict(AUTOTUNE_OPTIONS) if self.max_autotune else {}

    def __post_init__(self) -> None:
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {self.mode!r}")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph_mode must be one of {CUDAGRAPH_MODES}, "
                             f"got {self.cudagraph_mode!r}")


@dataclass
class EngineArgs(ParallelArgs, LoRAArgs, ParityArgs):
    """Everything LLM(...) and `compiled-llm` accept (runner and parallelism: ParallelArgs;
    adapters: LoRAArgs; vLLM's fields that change nothing here: ParityArgs); the *_config()
    methods derive the sub-configs. Every field's docstring is its flag's help."""

    model: str | None = None
    """Hugging Face model directory to load (default: the demo model shipped in the package)."""
    tokenizer: str | None = None
    """Tokenizer directory or name (default: the model's)."""
    dtype: str = "auto"
    """Weight and activation dtype: auto (the checkpoint's, float32 where config.json names
    none; a float16 one runs in float32 on CPU), float32, bfloat16 or float16."""
    device: str = "auto"
    """Device to run on: auto (cuda if available, else cpu) or a torch device name."""
    max_model_len: int | str | None = field(default=None,
                                            metadata={"parse": max_model_len_arg})
    """Longest sequence, prompt plus output, in tokens, also as vLLM spells it: 4k = 4000,
    4K = 4096 (default, also auto or -1: the model's max_position_embeddings, or fewer if the
    KV cache cannot hold one sequence that long; an explicit value the KV cache cannot hold
    is an error)."""
    max_num_seqs: int | None = None
    """Most sequences in one step (default: 256; 512 with performance_mode throughput)."""
    max_num_batched_tokens: int | None = None
    """Most tokens in one step (default: 8192, and 2048 in `serve`; 2048 with performance_mode
    interactivity, 16384 with throughput; or max_model_len if larger and chunked prefill is
    off)."""
    block_size: int = 16
    """Tokens per KV-cache block (a power of two)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the GPU's memory this engine may use: weights, activations and KV cache."""
    kv_cache_memory_bytes: int | None = field(default_factory=lambda: _env_int(ENV_KV_BYTES))
    """KV-cache budget in bytes: the budget on CPU (1 GiB if unset), and on GPU an override
    of gpu_memory_utilization (default: $COMPILED_LLM_KV_CACHE_MEMORY_BYTES)."""
    num_gpu_blocks_override: int | None = None
    """Allocate exactly this many KV blocks, whatever the memory budget."""
    kv_cache_dtype: KVCacheDtype = "auto"
    """KV cache dtype: auto (the model's), or fp8 (= fp8_e4m3) or fp8_e5m2, which halve the
    cache's bytes; per-tensor or per-head k_scale/v_scale come from the checkpoint, else they
    are calibrated on the first step's K/V."""
    enforce_eager: bool = False
    """Run eagerly: no compilation and no CUDA graphs (overrides compile_mode and
    cudagraph_mode)."""
    optimization_level: OptimizationLevel = 2
    """-O0: eager; -O1: compiled, fusion passes, piecewise CUDA graphs; -O2: -O1 plus full
    graphs of decode steps; -O3: -O2 plus GEMM autotuning (defaults only: see optimization.py)."""
    performance_mode: PerformanceMode = "balanced"
    """balanced; interactivity: a CUDA graph per batch size up to 32, 2048-token steps;
    throughput: 512 sequences, 16384-token steps (defaults only: see optimization.py)."""
    compile_mode: CompileMode | None = None
    """backend: compiled-llm's torch.compile backend; stock: torch.compile with Inductor;
    none: eager (default: from optimization_level, backend at -O1 and up)."""
    max_autotune: bool | None = None
    """Autotune GEMMs when compiling (default: from optimization_level, on at -O3)."""
    compile_cache_dir: str | None = None
    """Compile cache directory (default: $COMPILED_LLM_CACHE_DIR or ~/.cache/compiled_llm)."""
    dump_dir: str | None = None
    """Write the graphs before and after each pass, and Inductor's code, per piece here
    (default: $COMPILED_LLM_DUMP_DIR)."""
    passes: dict = field(default_factory=dict)
    """PassConfig overrides, e.g. {"enable_silu_mul": false}, over optimization_level's."""
    cudagraph_mode: CUDAGraphMode | None = None
    """Which CUDA graphs to capture: none, piecewise (per compiled piece), full (whole decode
    steps) or both (default: from optimization_level, full_and_piecewise at -O2)."""
    cudagraph_batch_sizes: list[int] | None = None
    """Batch sizes to capture full CUDA graphs for (default: 1, 2, 4, 8, 16, 24, 32, then
    every 16 up to max_num_seqs; every size up to 32 with performance_mode interactivity)."""
    max_cudagraph_capture_size: int | None = None
    """Most tokens a step may hold and still replay piecewise CUDA graphs (captured at powers
    of two up to it; default: 512, and `serve`'s token budget there); longer steps run the
    compiled pieces without graphs."""
    compilation_config: dict | None = field(default=None,
                                            metadata={"parse": compilation_config_arg})
    """vLLM's CompilationConfig (a dict, JSON, a mode 0-3 or an object; -cc.KEY=VALUE, -O JSON)
    read into the fields above: mode/level, cudagraph_mode, cudagraph_capture_sizes,
    max_cudagraph_capture_size, pass_config, inductor_compile_config.max_autotune,
    debug_dump_path, cache_dir; compile_cache_save_format changes nothing; other keys asking
    for something are refused (compiled_llm/optimization.py)."""
    cuda_graph_sizes: list[int] | None = None
    """vLLM 0.11's capture sizes: one value N captures graphs up to N tokens
    (max_cudagraph_capture_size), several are the capture list (as compilation_config's
    cudagraph_capture_sizes)."""
    enable_chunked_prefill: bool = True
    """Split long prompts over several steps so prefill shares steps with decode."""
    load_format: LoadFormat = "auto"
    """Checkpoint format: auto (safetensors; pickle .bin files refused), safetensors, or pt
    (allow pickle .bin files)."""
    quantization: QuantizationMethods | None = None
    """fp8: quantize at load (W8A8); a quantized checkpoint's format comes from config.json."""
    enable_prefix_caching: bool = True
    """Reuse the KV blocks of prompt prefixes already computed."""
    prefix_caching_hash_algo: PrefixCachingHashAlgo = "xxhash"
    """Block hash for prefix caching: xxhash (fast) or sha256."""
    scheduling_policy: SchedulerPolicy = "fcfs"
    """fcfs: first come, first served; priority: the lowest request priority value first."""
    max_decode_slowdown: float | None = None
    """With requests decoding, cap each step's prompt tokens so the step lasts at most this
    many times a decode-only step, both learned from the steps run: it bounds inter-token
    latency while prompts arrive, at a cost in throughput that is large today: steps of more
    than max_cudagraph_capture_size tokens run without CUDA graphs (default: none; 0: none)."""
    async_scheduling: bool = True
    """Schedule and launch step N+1 before reading step N's tokens, so host work overlaps the
    device; a step returns the previous step's outputs. Sampling that needs the previous token
    on the host (grammars, logits processors) reads it while step N+1's forward runs."""
    seed: int | None = 0
    """torch's global seed, set at engine start: sampling without a per-request seed draws
    from it (None: 0, as vLLM's)."""
    skip_tokenizer_init: bool = False
    """Load no tokenizer: prompts must be token ids and outputs carry no text."""
    attention_backend: AttentionBackendName = "auto"
    """Attention kernels: auto (triton on CUDA, torch elsewhere), torch or triton."""
    max_logprobs: int = 20
    """Most logprobs (and prompt_logprobs) a request may ask for per token (-1: the whole
    vocabulary, which a request asks for with -1)."""
    max_n_sequences: int = 128
    """Largest n (sequences per request); OpenAI's own limit is 128."""
    max_stop_strings: int = 64
    """Most stop strings a request may give (each is searched for at every token)."""
    max_stop_string_chars: int = 1024
    """Longest stop string, in characters (a prefix of one is held back while streaming)."""
    structured_outputs_max_bytes: int = 64 << 10
    """Largest structured-output spec (JSON schema, regex, choices or grammar), in bytes, the
    engine compiles; larger ones are refused."""
    structured_outputs_timeout_s: float = 10.0
    """Longest a request waits for its grammar to compile, in seconds (compiling runs on
    threads of its own); a spec that runs out of time is refused from then on."""
    max_prompt_bytes: int | None = None
    """Longest text prompt, in UTF-8 bytes, the engine tokenizes at all: longer ones are
    refused before tokenization (default: 64 bytes per token of max_model_len, more than
    any prompt that fits needs)."""
    speculative_config: dict | None = None
    """Speculative decoding, as vLLM spells it: {"method": "ngram", "num_speculative_tokens": k,
    "prompt_lookup_max": 4, "prompt_lookup_min": 2} or {"method": "draft_model" | "medusa" |
    "eagle" | "eagle3", "model": DIR, "num_speculative_tokens": k} (default: off)."""
    generation_config: str = "auto"
    """Where requests' default sampling parameters come from: auto (the model's
    generation_config.json: temperature, top_k, top_p, min_p, repetition_penalty,
    max_new_tokens), vllm (SamplingParams' own) or a directory holding a generation_config.json."""
    override_generation_config: dict | None = None
    """Default sampling parameters over the generation config's, e.g. {"temperature": 0.5}."""
    engine_core_process: bool | None = None
    """Run the engine core (scheduler, model, sampler) in a process of its own, so that
    tokenization, detokenization, output building and HTTP overlap it (default: on behind
    AsyncLLM and the server; for LLM on CUDA, off on the CPU)."""

    def __post_init__(self) -> None:
        apply_compilation_config(self)  # into the fields it maps to, checked below
        check_choices(self)
        check_minimums(self, _REQUEST_LIMITS)
        self.check_lora()
        self.resolve_draft_id()  # a draft by Hub id: its directory, before the config is read
        check_speculative(self)  # ValueError naming the speculative_config field at fault
        self.check_parallel()
        self.check_parallel_combinations()
        self.cache_config()  # block_size, gpu_memory_utilization: refused before a core starts
        if self.max_decode_slowdown and not 1 < self.max_decode_slowdown < math.inf:
            raise ValueError(f"max_decode_slowdown must be > 1 and finite (or 0: none), got "
                             f"{self.max_decode_slowdown}")
        self.seed = 0 if self.seed is None else self.seed
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an int (or None), got {self.seed!r}")
        self.check_parity()
        self.resolve_hub_ids()  # after the cheap checks: it may download a checkpoint
        self.apply_hf_overrides()  # model: the checkpoint with the merged config.json
        # a count or None (auto) from here on, whichever spelling was given
        self.max_model_len = normalize_max_model_len(self.max_model_len)

    def attention_backend_for(self, device_type: str, head_dim: int | None = None) -> str:
        """The attention backend for a device type and the model's head_dim (auto: Triton on
        CUDA where its kernels take head_dim; see config_fields.attention_backend_for)."""
        return attention_backend_for(self.attention_backend, device_type, head_dim)

    def scheduler_config(self, model_max_len: int,
                         default_len: int | None = None) -> SchedulerConfig:
        """The scheduler's settings, max_model_len capped by the model's positions: the value
        given, else default_len (else model_max_len). With no value given this is an upper
        bound the worker lowers to what the KV cache holds."""
        max_len = self.max_model_len or default_len or model_max_len
        if max_len > model_max_len:
            raise ValueError(
                f"max_model_len {max_len} exceeds the model's maximum length {model_max_len} "
                "(max_position_embeddings, times a linear or dynamic rope scaling factor; "
                "attention_chunk_size where chunked attention layers are; index_topk where "
                "DeepSeek sparse attention is)"
            )
        mode = PERFORMANCE_MODES[self.performance_mode]
        tokens = self.max_num_batched_tokens
        if tokens is None:
            tokens = max(mode.max_num_batched_tokens, 0 if self.enable_chunked_prefill else max_len)
        seqs = mode.max_num_seqs if self.max_num_seqs is None else self.max_num_seqs
        return SchedulerConfig(seqs, tokens, max_len, self.enable_chunked_prefill,
                               self.scheduling_policy, self.max_decode_slowdown or None)

    def cache_config(self) -> CacheConfig:
        """The KV cache's settings."""
        return CacheConfig(self.block_size, self.gpu_memory_utilization,
                           self.kv_cache_memory_bytes, self.num_gpu_blocks_override,
                           self.kv_cache_dtype)

    def compile_config(self) -> CompileConfig:
        """The compiler's settings: the fields given, else optimization_level's and
        performance_mode's defaults (enforce_eager turns compilation and CUDA graphs off)."""
        level = level_defaults(self.optimization_level)
        autotune = level.max_autotune if self.max_autotune is None else self.max_autotune
        return CompileConfig(
            mode="none" if self.enforce_eager else self.compile_mode or level.compile_mode,
            cache_dir=self.compile_cache_dir, dump_dir=self.dump_dir,
            passes={**level.passes, **self.passes},
            cudagraph_mode="none" if self.enforce_eager else (
                self.cudagraph_mode or level.cudagraph_mode),
            cudagraph_batch_sizes=self.cudagraph_batch_sizes or mode_graph_sizes(
                self.performance_mode, self.max_num_seqs), max_autotune=autotune,
            **self._piecewise_limit())

    def _piecewise_limit(self) -> dict:
        """piecewise_max_tokens from max_cudagraph_capture_size, at most the token budget (a
        graph no step can use would only cost capture time and memory)."""
        if self.max_cudagraph_capture_size is None:
            return {}
        budget = (self.max_num_batched_tokens
                  or PERFORMANCE_MODES[self.performance_mode].max_num_batched_tokens)
        return {"piecewise_max_tokens": min(self.max_cudagraph_capture_size, budget)}
