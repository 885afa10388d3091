"""EngineArgs' mixins, validated when EngineArgs is made: ParallelArgs (tensor and pipeline
parallel sizes, expert parallelism, the executor that runs the ranks) and ParityArgs (vLLM's
model-source fields, Hub ids read as their snapshot directories, and its fields that change
nothing here: accepted where they would change nothing, else refused)."""

from __future__ import annotations

import json
import os
import re
import typing
from dataclasses import dataclass
from typing import Literal

from compiled_llm.config_fields import check_hf_overrides, overlay_model_dir, overlay_source
from compiled_llm.pooling_params import RunnerArgs

ExecutorBackend = Literal["uni", "mp", "ray"]
EXECUTOR_BACKENDS: tuple[str, ...] = typing.get_args(ExecutorBackend)
TokenizerMode = Literal["auto"]  # vLLM's slow, mistral and custom are not supported
LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]


@dataclass
class ParallelArgs(RunnerArgs):
    """Parallelism settings; EngineArgs inherits them (and RunnerArgs through them)."""

    tensor_parallel_size: int = 1
    """Ranks each layer's weights are sharded over (one process and device per rank): q/k/v
    and gate/up by rows, o/down by columns, embedding and LM head by vocab."""
    pipeline_parallel_size: int = 1
    """Pipeline stages: the decoder's layers split into this many contiguous stages, one
    process and device each (vLLM's split; VLLM_PP_LAYER_PARTITION sets it by hand). The
    stages of a step run one after another (no micro-batches in flight); not with
    tensor_parallel_size > 1 yet."""
    enable_expert_parallel: bool = False
    """Mixture-of-experts layers hold whole experts per rank (num_experts / tensor_parallel_size
    each, the router replicated) instead of a slice of every expert; needs
    tensor_parallel_size > 1."""
    distributed_executor_backend: ExecutorBackend | None = None
    """How ranks run: uni (one rank, in the engine's process), mp (a process per rank beside
    the engine's, which holds rank 0) or ray (Ray actors for ranks 1..N-1, one host) (default:
    uni for one rank, mp for more)."""

    def check_parallel(self) -> None:
        """ValueError naming the field for a size or backend the engine cannot run."""
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            size = getattr(self, name)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"{name} must be an int >= 1, got {size!r}")
        if not isinstance(self.enable_expert_parallel, bool):
            raise ValueError(f"enable_expert_parallel must be a bool, got "
                             f"{self.enable_expert_parallel!r}")
        if self.enable_expert_parallel and self.tensor_parallel_size == 1:
            raise ValueError("enable_expert_parallel needs tensor_parallel_size > 1 (the experts "
                             "are split over the tensor-parallel ranks)")
        if self.distributed_executor_backend == "uni" and self.world_size > 1:
            raise ValueError(f'distributed_executor_backend "uni" runs one rank; '
                             f"{self.parallel_field} {self.world_size} needs \"mp\"")

    def check_parallel_combinations(self) -> None:
        """ValueError naming tensor_parallel_size or pipeline_parallel_size with a feature
        that does not run over several ranks yet (LoRA, speculative decoding; quantization
        over pipeline stages)."""
        if self.world_size == 1:
            return
        field = self.parallel_field
        # quantization="fp8" quantizes each tensor-parallel shard (not a pipeline's stages)
        names = ("enable_lora", "speculative_config") + (
            ("quantization",) if self.pipeline_parallel_size > 1 else ())
        for name in names:
            if getattr(self, name, None):
                raise ValueError(f"{field} {self.world_size} with {name}: not supported "
                                 f"together yet; use {field} 1")
        # an FP8 cache without checkpoint scales is calibrated on the first step by the
        # driver's forward alone: the other stages' layers would keep scales of 1
        kv_dtype = str(getattr(self, "kv_cache_dtype", "auto"))
        if self.pipeline_parallel_size > 1 and kv_dtype.startswith("fp8"):
            raise ValueError(f"pipeline_parallel_size {self.pipeline_parallel_size} with "
                             f"kv_cache_dtype {kv_dtype!r}: not supported together yet; use "
                             "kv_cache_dtype auto")

    @property
    def world_size(self) -> int:
        """Ranks in all: one process and device each."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def parallel_field(self) -> str:
        """The field that asks for several ranks (errors name it)."""
        return "pipeline_parallel_size" if self.pipeline_parallel_size > 1 \
            else "tensor_parallel_size"

    @property
    def executor_backend(self) -> str:
        """The backend that runs the ranks: the one given, else uni for one rank, else mp."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "uni" if self.world_size == 1 else "mp"


@dataclass
class ParityArgs:
    """vLLM's model-source and logging fields, and those it has that change nothing here or
    are refused; EngineArgs inherits them."""

    trust_remote_code: bool = False
    """Accepted for vLLM compatibility; it changes nothing: compiled-llm runs only its
    built-in model architectures and never executes a checkpoint's own Python code (a
    checkpoint that needs it is refused either way)."""
    tokenizer_mode: TokenizerMode = "auto"
    """How the tokenizer is loaded: auto (Hugging Face's AutoTokenizer, fast where the
    checkpoint has one); vLLM's slow, mistral and custom modes are not supported."""
    revision: str | None = None
    """The Hugging Face Hub revision (branch, tag or commit) of a model given by its Hub id;
    refused for a local directory."""
    tokenizer_revision: str | None = None
    """The Hub revision of a tokenizer given by its Hub id; refused for a local directory."""
    download_dir: str | None = None
    """The Hugging Face cache directory to read and download Hub models into (default: the
    Hub's, $HF_HUB_CACHE); unused for a local model directory, as in vLLM."""
    hf_overrides: dict | None = None
    """vLLM's overrides of the model's Hugging Face config: config.json keys replaced before
    anything reads it, e.g. {"max_position_embeddings": 65536, "rope_scaling": {...}} (a
    sub-config such as text_config takes its keys one by one; a dict or its JSON; vLLM's
    callable form is refused)."""
    disable_sliding_window: bool = False
    """vLLM's switch that caps the context at a model's sliding window instead of using it.
    Not supported: sliding-window attention always runs as the model defines it."""
    disable_log_stats: bool = False
    """vLLM's switch off of its periodic engine-stats log lines. compiled-llm writes none, so
    it changes nothing (/metrics is served either way)."""
    logprobs_mode: LogprobsMode = "raw_logprobs"
    """What logprobs report: raw_logprobs, the model's log-softmax before any sampling
    parameter (vLLM's default). vLLM's raw_logits and processed_* modes are refused."""
    swap_space: float = 4
    """vLLM's CPU swap space per GPU, in GiB. Accepted; it changes nothing: a preempted
    request is recomputed, never swapped (as in vLLM's V1 engine)."""
    cpu_offload_gb: float = 0
    """vLLM's weights offloaded to CPU memory, in GiB. Not supported: 0 is accepted, more is
    refused."""
    max_seq_len_to_capture: int | None = None
    """vLLM's longest sequence a CUDA graph covers. Accepted; it changes nothing: graphs here
    are captured per token count (max_cudagraph_capture_size), whatever the context."""
    disable_custom_all_reduce: bool = False
    """vLLM's switch off of its custom all-reduce kernel. Accepted; it changes nothing:
    tensor parallelism here all-reduces through torch.distributed (NCCL) alone."""
    data_parallel_size: int = 1
    """vLLM's data-parallel engine replicas. Not supported: 1 is accepted, more is refused
    (run several servers behind a load balancer instead)."""
    structured_outputs_config: dict | None = None
    """vLLM's structured-outputs settings, e.g. {"backend": "xgrammar"}: backend auto or
    xgrammar (the one used here) is accepted; any other backend, or another key set off its
    default, is refused."""
    guided_decoding_backend: str | None = None
    """vLLM's older spelling of structured_outputs_config's backend: auto or xgrammar."""
    limit_mm_per_prompt: dict | None = None
    """vLLM's most items of each modality per prompt, e.g. {"image": 0}: checked (modality ->
    count >= 0) and accepted; the models here take text alone, so a multimodal input is
    refused whatever it says."""

    def check_parity(self) -> None:
        """ValueError naming the first field set to something compiled-llm cannot do."""
        if not isinstance(self.trust_remote_code, bool):
            raise ValueError(f"trust_remote_code must be a bool, got {self.trust_remote_code!r}")
        self.hf_overrides = check_hf_overrides(self.hf_overrides)
        if self.logprobs_mode != "raw_logprobs":
            raise ValueError(f"logprobs_mode={self.logprobs_mode!r} is not supported: "
                             "logprobs are the model's raw log-softmax (raw_logprobs)")
        if self.disable_sliding_window:
            raise ValueError("disable_sliding_window: not supported; sliding-window attention "
                             "runs as the model defines it")
        if self.cpu_offload_gb:
            raise ValueError(f"cpu_offload_gb={self.cpu_offload_gb!r}: offloading weights to "
                             "CPU memory is not supported (give 0)")
        if not isinstance(self.swap_space, int | float) or self.swap_space < 0:
            raise ValueError(f"swap_space must be a number >= 0, got {self.swap_space!r}")
        self._check_vllm_frontend()

    def _check_vllm_frontend(self) -> None:
        """ValueError naming data_parallel_size, the structured-outputs backend or
        limit_mm_per_prompt for a value compiled-llm cannot follow."""
        size = self.data_parallel_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"data_parallel_size must be an int >= 1, got {size!r}")
        if size > 1:
            raise ValueError(f"data_parallel_size {size}: data parallelism is not supported "
                             "(one engine per server); give 1, or run several servers")
        check_backend("guided_decoding_backend", self.guided_decoding_backend)
        config = self.structured_outputs_config
        if config is not None:
            if not isinstance(config, dict):
                raise ValueError(f"structured_outputs_config must be an object, got {config!r}")
            check_backend("structured_outputs_config.backend", config.get("backend"))
            for key, value in config.items():
                if key != "backend" and value not in _STRUCTURED_ACCEPTED.get(key, ()):
                    raise ValueError(f"structured_outputs_config.{key}={value!r}: not supported "
                                     "(only backend auto or xgrammar)")
        check_mm_limits(self.limit_mm_per_prompt)

    def resolve_hub_ids(self) -> None:
        """model, tokenizer and a speculative draft given as Hugging Face Hub ids ("org/name")
        become their local snapshot directories (the Hub cache's, downloaded into it when
        missing), as vLLM loads them; their revisions are then spent. A revision for a local
        directory, or an id the Hub and its cache lack, is a ValueError naming the field."""
        model, tokenizer = getattr(self, "model", None), getattr(self, "tokenizer", None)
        if tokenizer is None and self.tokenizer_revision is not None:
            tokenizer = model  # vLLM: the model's tokenizer, at its own revision
        tokenizer_revision = self.tokenizer_revision
        if tokenizer_revision is None and tokenizer is not None and is_hub_id(tokenizer):
            tokenizer_revision = self.revision  # vLLM's default
        self.model = self._local("model", model, "revision", self.revision, True)
        self.tokenizer = self._local("tokenizer", tokenizer, "tokenizer_revision",
                                     tokenizer_revision, False)
        self.revision = self.tokenizer_revision = None  # spent: args built again see dirs

    def apply_hf_overrides(self) -> None:
        """With hf_overrides, model becomes a directory of its files and the merged config.json
        (config_fields.overlay_model_dir); its tokenizer stays the model's. The overrides are
        then spent, so args built again do not apply them twice."""
        if not self.hf_overrides:
            return
        if getattr(self, "model", None) is None:
            raise ValueError("hf_overrides needs a model to override")
        self.tokenizer = self.tokenizer or self.model
        self.model = overlay_model_dir(self.model, self.hf_overrides)
        self.hf_overrides = None

    def _local(self, field: str, source: str | None, revision_field: str,
               revision: str | None, weights: bool) -> str | None:
        if source is not None and is_hub_id(source):
            return hub_snapshot(field, source, revision, self.download_dir, weights,
                                getattr(self, "load_format", "auto"))
        if revision is not None:
            raise ValueError(f"{revision_field}: {revision!r} selects a Hub revision, but "
                             f"{field} {source!r} is not a Hub id (a local directory is used "
                             "as it is)")
        return source

    def resolve_draft_id(self) -> None:
        """speculative_config's model (a draft model, EAGLE or Medusa heads) by Hub id: its
        snapshot directory, at the config's revision (then spent)."""
        spec = getattr(self, "speculative_config", None)
        draft = spec.get("model") if isinstance(spec, dict) else None
        if isinstance(draft, str) and is_hub_id(draft):
            path = hub_snapshot("speculative_config.model", draft, spec.get("revision"),
                                self.download_dir, True, getattr(self, "load_format", "auto"))
            self.speculative_config = {**spec, "model": path, "revision": None}


# vLLM's StructuredOutputsConfig keys and the values that describe what runs here: its
# defaults; disable_any_whitespace True too (JSON is compact here unless a request asks for
# any_whitespace) and disable_fallback either way (no other backend to fall back to)
_STRUCTURED_ACCEPTED = {"disable_fallback": (False, True), "disable_any_whitespace": (False, True),
                        "disable_additional_properties": (False,), "reasoning_parser": ("",),
                        "enable_in_reasoning": (False,)}
STRUCTURED_BACKENDS = ("auto", "xgrammar")


def check_backend(field: str, backend: object) -> None:
    """ValueError naming field for a structured-outputs backend other than auto or xgrammar."""
    if backend is not None and backend not in STRUCTURED_BACKENDS:
        raise ValueError(f"{field}={backend!r}: not supported; structured outputs run on "
                         "xgrammar here (give auto or xgrammar)")


def check_mm_limits(limits: object) -> None:
    """ValueError naming limit_mm_per_prompt unless it is None or modality -> count >= 0."""
    if limits is None:
        return
    if not isinstance(limits, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in limits.items()):
        raise ValueError(f"limit_mm_per_prompt must map each modality to a count >= 0, e.g. "
                         f'{{"image": 0}}, got {limits!r}')


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TEXT_FILES = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken"]  # configs, tokenizers
_SNAPSHOT = re.compile(r"models--([^/\\]+?)--([^/\\]+)[/\\]snapshots[/\\][^/\\]+[/\\]?$")
_SKIP = ["original/*"]  # another format's copy of the weights (fnmatch's * crosses "/")
_INDEXES = {".safetensors": "model.safetensors.index.json", ".bin": "pytorch_model.bin.index.json"}


def hub_id_of(path: str | os.PathLike | None) -> str | None:
    """The Hub id ("org/name") whose cached snapshot path is (…/models--org--name/snapshots/
    SHA), else None: the name a model loaded by its id is shown under."""
    match = _SNAPSHOT.search(os.fspath(path)) if path is not None else None
    return None if match is None else f"{match.group(1)}/{match.group(2)}"


def shown_model_name(path: str | os.PathLike | None) -> str | None:
    """The name a model directory is shown and served under: the model as given where path
    holds hf_overrides' merged config, the Hub id of a Hub snapshot, else path itself."""
    if path is None:
        return None
    source = overlay_source(path) or os.fspath(path)
    return hub_id_of(source) or source


def is_hub_id(source: str | os.PathLike) -> bool:
    """Whether source names a Hub repository ("org/name") rather than a path: no existing
    file or directory has that name, and it has the Hub's shape."""
    source = os.fspath(source)
    return not os.path.exists(source) and bool(_HUB_ID.match(source))


def hub_snapshot(field: str, repo_id: str, revision: str | None, cache_dir: str | None,
                 weights: bool, load_format: str) -> str:
    """The local snapshot directory of repo_id at revision, holding its config and tokenizer
    files and, with weights, the checkpoint the loader reads (the index's shards, else the
    top-level safetensors, else .bin): the cache's where it has them, else downloaded into
    it. ValueError naming field when they cannot be had."""
    from huggingface_hub import snapshot_download

    def fetch(patterns: list[str]) -> str:
        kwargs = dict(repo_id=repo_id, revision=revision, cache_dir=cache_dir,
                      allow_patterns=patterns, ignore_patterns=_SKIP)
        try:
            return snapshot_download(local_files_only=True, **kwargs)
        except Exception:  # not in the cache (or not whole): download what is missing
            return snapshot_download(**kwargs)

    try:
        snapshot = fetch(_TEXT_FILES)
        names = _weight_names(snapshot, repo_id, revision, load_format) if weights else []
        if names and not all(os.path.exists(os.path.join(snapshot, n)) for n in names):
            snapshot = fetch(names)
    except Exception as e:  # offline and not cached, unknown, gated, a bad revision, disk ...
        raise ValueError(f"{field}: {repo_id!r} is not a local directory, and it could not be "
                         f"had from the Hugging Face Hub or its cache: "
                         f"{type(e).__name__}: {e}") from None
    return snapshot


def _weight_names(snapshot: str, repo_id: str, revision: str | None,
                  load_format: str) -> list[str]:
    """The weight files of the checkpoint the loader will read, in the order it looks:
    an index's shards, else the top-level files of the first extension the repo has (the
    cache's listing first, then the Hub's)."""
    exts = [".bin", ".safetensors"] if load_format == "pt" else [".safetensors", ".bin"]
    for ext in exts:
        index = os.path.join(snapshot, _INDEXES[ext])
        if os.path.exists(index):
            with open(index) as f:
                return sorted(set(json.load(f)["weight_map"].values()))
    for listing in (lambda: os.listdir(snapshot), lambda: _hub_files(repo_id, revision)):
        files = [name for name in listing() if "/" not in name]
        for ext in exts:
            found = sorted(name for name in files if name.endswith(ext))
            if found:
                return found
    return []


def _hub_files(repo_id: str, revision: str | None) -> list[str]:
    from huggingface_hub import HfApi

    return HfApi().list_repo_files(repo_id, revision=revision)
