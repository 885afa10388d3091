"""From an API request to engine inputs: SamplingParams (with structured outputs taken from
response_format or vLLM's extra fields) and the output-length budget."""

from __future__ import annotations

import json

from compiled_llm.engine.inputs import truncated_ids, truncated_text_ids
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.protocol import (
    ChatCompletionRequest,
    SamplingFields,
    whole_number,
)
from compiled_llm.entrypoints.server.unsupported import refuse_unsupported
from compiled_llm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams


def structured_spec(req: SamplingFields) -> StructuredOutputsParams | None:
    """The one structured-output constraint the request asks for, if any."""
    specs = []
    response_format = req.response_format
    if response_format is not None and response_format.type == "json_object":
        specs.append(("response_format", {"json_object": True}))
    elif response_format is not None and response_format.type == "json_schema":
        json_schema = response_format.json_schema
        schema = json_schema.schema_ if json_schema else None
        if schema is None:
            raise OpenAIError(400, "response_format.json_schema.schema is required",
                              param="response_format")
        specs.append(("response_format", {"json": schema}))
    elif response_format is not None and response_format.type == "structural_tag":
        specs.append(("response_format", {"structural_tag": _structural_tag(response_format)}))
    guided = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
              "guided_grammar": "grammar"}
    specs += [(f, {kind: getattr(req, f)}) for f, kind in guided.items()
              if getattr(req, f) is not None]
    if req.structured_outputs is not None:
        specs.append(("structured_outputs", req.structured_outputs))
    if len(specs) > 1:
        raise OpenAIError(400, "give at most one of response_format, structured_outputs and "
                          f"guided_*; got {[f for f, _ in specs]}", param=specs[1][0])
    if not specs:
        return None
    field, spec = specs[0]
    if isinstance(spec.get("json"), str):
        try:
            json.loads(spec["json"])
        except json.JSONDecodeError as exc:
            raise OpenAIError(400, f"{field}: the JSON schema is not valid JSON: {exc}",
                              param=field) from None
    try:
        return StructuredOutputsParams.from_dict(spec)
    except (TypeError, ValueError) as exc:
        raise OpenAIError(400, f"{field}: {exc}", param=field) from None


def _structural_tag(response_format) -> str:
    """vLLM's structural tag of a response_format: its structures and triggers (the legacy
    form) or its format (xgrammar's), as the JSON text structured outputs take."""
    if response_format.format is not None:
        tag = {"type": "structural_tag", "format": response_format.format}
    elif response_format.structures is not None and response_format.triggers is not None:
        tag = {"type": "structural_tag", "triggers": response_format.triggers,
               "structures": [item.model_dump(by_alias=True)
                              for item in response_format.structures]}
    else:
        raise OpenAIError(400, "response_format: a structural_tag needs structures and "
                          "triggers, or format", param="response_format")
    return json.dumps(tag, ensure_ascii=False)


def truncated_prompt(req, ids: list[int], max_model_len: int, tokenizer=None,
                     text: str | None = None) -> list[int]:
    """ids cut to the request's truncate_prompt_tokens (vLLM's extra field): its last k
    tokens, or with -1 the most that leave room for one output token; ids encoded from text
    (with the request's add_special_tokens) keep the special tokens the tokenizer adds (a
    BOS), as vLLM's tokenizer truncates. A 400 naming the field for anything but an int >= 1
    or -1."""
    keep = whole_number((req.model_extra or {}).get("truncate_prompt_tokens"))
    valid = keep is None or (type(keep) is int and (keep == -1 or keep >= 1))
    if not valid:
        raise OpenAIError(400, f"truncate_prompt_tokens must be -1 or an integer >= 1, got "
                          f"{keep!r}", param="truncate_prompt_tokens")
    if text is None:
        return truncated_ids(ids, keep, max_model_len)
    return truncated_text_ids(tokenizer, text, ids, keep, max_model_len,
                              getattr(req, "add_special_tokens", True))


def output_budget(requested: int | None, prompt_len: int, max_model_len: int, *,
                  prompt_param: str = "messages", budget_param: str = "max_tokens",
                  default: int | None = None, cap: int | None = None) -> int:
    """max_tokens: the request's, checked to be >= 1 and to fit the context, else the
    default (the generation config's) within what the context leaves; never past cap. A 400
    names prompt_param or budget_param, the field at fault."""
    if prompt_len >= max_model_len:
        raise OpenAIError(400, f"the prompt is {prompt_len} tokens; this model's maximum "
                          f"context length is {max_model_len} tokens", param=prompt_param,
                          code="context_length_exceeded")
    if requested is None:
        left = max_model_len - prompt_len
        return min([left, *(limit for limit in (default, cap) if limit is not None)])
    requested = _checked_budget(requested, prompt_len, max_model_len, budget_param)
    return requested if cap is None else min(requested, cap)


def _checked_budget(requested: int, prompt_len: int, max_model_len: int,
                    budget_param: str) -> int:
    if requested < 1:
        raise OpenAIError(400, f"{budget_param} must be >= 1, got {requested}",
                          param=budget_param, code="invalid_value")
    if prompt_len + requested > max_model_len:
        raise OpenAIError(400, f"this model's maximum context length is {max_model_len} "
                          f"tokens; you asked for {prompt_len} prompt + {requested} output "
                          "tokens", param=budget_param, code="context_length_exceeded")
    return requested


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias (token id strings -> bias) keyed by int, each bias clamped to
    [-100, 100] as vLLM does; 400 on bad keys or a NaN (ids outside the vocabulary are the
    engine's 400)."""
    if not bias:
        return None
    try:
        items = {int(token): value for token, value in bias.items()}
    except ValueError:
        raise OpenAIError(400, "logit_bias keys must be token ids", param="logit_bias") from None
    if any(value != value for value in items.values()):
        raise OpenAIError(400, "logit_bias values must be numbers", param="logit_bias")
    return {token: min(100.0, max(-100.0, value)) for token, value in items.items()}


def sampling_params(req: SamplingFields, max_tokens: int, logprobs: int | None,
                    stream: bool, prompt_logprobs: int | None = None,
                    defaults: dict | None = None) -> SamplingParams:
    """SamplingParams for req; ValueError (-> 400, naming the field) on bad values (the
    engine checks what needs the model: ids in the vocabulary, n and logprobs limits).
    prompt_logprobs is the handler's default for the request's field of that name; defaults
    (the model's generation config, max_tokens aside) fill the sampling fields req leaves
    unset."""
    refuse_unsupported(req.model_extra, chat=isinstance(req, ChatCompletionRequest))
    if req.stream_options is not None and not req.stream:
        raise OpenAIError(400, "stream_options is only allowed with stream=true",
                          param="stream_options")
    if req.prompt_logprobs is not None and req.stream:  # as vLLM: only in a whole body
        raise OpenAIError(400, "prompt_logprobs is not available with stream=true",
                          param="prompt_logprobs")
    if req.prompt_logprobs is not None:
        prompt_logprobs = req.prompt_logprobs
    optional = {name: value for name, value in (
        ("temperature", req.temperature), ("top_p", req.top_p), ("top_k", req.top_k),
        ("min_p", req.min_p), ("repetition_penalty", req.repetition_penalty)) if value is not None}
    optional = {**(defaults or {}), **optional}
    return SamplingParams(
        n=req.n, max_tokens=max_tokens, stop=req.stop, seed=req.seed, logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        min_tokens=req.min_tokens, ignore_eos=req.ignore_eos,
        stop_token_ids=req.stop_token_ids, skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        logit_bias=_logit_bias(req.logit_bias), allowed_token_ids=req.allowed_token_ids,
        structured_outputs=structured_spec(req),
        bad_words=(req.model_extra or {}).get("bad_words"),  # vLLM's extra field
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        **optional)
