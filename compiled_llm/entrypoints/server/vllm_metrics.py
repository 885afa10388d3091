"""vLLM's Prometheus names for the server's metrics whose meaning matches vLLM's, so that
dashboards built for `vllm:*` read this server: each alias is the compiled_llm family renamed
at scrape time (same samples and `model_name` label, plus vLLM's `engine`), with vLLM's label
and type where they differ. Metrics vLLM has no counterpart for (kv_cache_used_blocks, rejected
requests) have none."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

_SOURCE = "compiled_llm:"
ENGINE_LABEL = {"engine": "0"}  # vLLM labels each series with its engine index (one here)


@dataclass(frozen=True)
class Alias:
    """One vLLM name for a compiled_llm family: its type if it differs (a cumulative count
    kept as a gauge here is a counter in vLLM), labels renamed, samples left out by label."""

    name: str
    type: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    drop: dict[str, str] = field(default_factory=dict)


_OUTCOME = dict(labels={"outcome": "finished_reason"}, drop={"outcome": "rejected"})

ALIASES: dict[str, tuple[Alias, ...]] = {
    "num_requests_running": (Alias("vllm:num_requests_running"),),
    "num_requests_waiting": (Alias("vllm:num_requests_waiting"),),
    # vLLM 0.x's name, and the name from its V1 engine on: both in [0, 1]
    "kv_cache_usage_perc": (Alias("vllm:kv_cache_usage_perc"),
                            Alias("vllm:gpu_cache_usage_perc")),
    "num_preemptions": (Alias("vllm:num_preemptions", type="counter"),),
    "prompt_tokens": (Alias("vllm:prompt_tokens"),),
    "generation_tokens": (Alias("vllm:generation_tokens"),),
    # vLLM counts finished engine requests; one refused at admission never reached it
    "request_success": (Alias("vllm:request_success", **_OUTCOME),),
    "time_to_first_token_seconds": (Alias("vllm:time_to_first_token_seconds"),),
    # the V1 name, and the older name of the same per-token gap
    "inter_token_latency_seconds": (Alias("vllm:inter_token_latency_seconds"),
                                    Alias("vllm:time_per_output_token_seconds")),
    "e2e_request_latency_seconds": (Alias("vllm:e2e_request_latency_seconds"),),
    "request_prompt_tokens": (Alias("vllm:request_prompt_tokens"),),
    "request_generation_tokens": (Alias("vllm:request_generation_tokens"),),
    **{name: (Alias(f"vllm:{name}"),) for name in (
        "request_params_n", "request_params_max_tokens", "request_max_num_generation_tokens",
        "request_decode_time_seconds", "request_time_per_output_token_seconds",
        "request_queue_time_seconds", "request_prefill_time_seconds",
        "request_inference_time_seconds")},
    "prefix_cache_queries": (Alias("vllm:prefix_cache_queries"),),
    "prefix_cache_hits": (Alias("vllm:prefix_cache_hits"),),
    **{f"spec_decode_{name}": (Alias(f"vllm:spec_decode_{name}"),) for name in (
        "num_drafts", "num_draft_tokens", "num_accepted_tokens",
        "num_accepted_tokens_per_pos")},
}


def vllm_families(families: Iterable[Metric]) -> Iterator[Metric]:
    """The vLLM-named copies of those of families that have aliases."""
    for family in families:
        for alias in ALIASES.get(family.name.removeprefix(_SOURCE), ()):
            yield renamed(family, alias)


def renamed(family: Metric, alias: Alias) -> Metric:
    """family under alias's name, type and labels; a sample keeps its suffix (_bucket,
    _total ...), and a gauge turned counter gets _total."""
    kind = alias.type or family.type
    out = Metric(alias.name, family.documentation, kind)
    for sample in family.samples:
        if any(sample.labels.get(key) == value for key, value in alias.drop.items()):
            continue
        suffix = sample.name[len(family.name):]
        if kind == "counter" and family.type != "counter":
            suffix = "_total"
        labels = {alias.labels.get(key, key): value for key, value in sample.labels.items()}
        labels.update(ENGINE_LABEL)
        out.add_sample(alias.name + suffix, labels, sample.value, sample.timestamp,
                       sample.exemplar)
    return out
