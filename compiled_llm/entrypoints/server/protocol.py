"""Request and response bodies of the OpenAI-compatible API (pydantic), with vLLM's extras.
Types are checked here (counts as vLLM's lax ints: 16.0 is 16, true is 1), strings must be
valid UTF-8; value ranges are checked once, by SamplingParams and the engine. Fields no API
defines are ignored, as vLLM ignores them; those it defines but this server does not honour
are refused (unsupported.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)
from pydantic.functional_validators import BeforeValidator
from pydantic_core import PydanticCustomError

from compiled_llm.entrypoints.chat_utils import REASONING_EFFORTS, join_text_parts
from compiled_llm.sampling_params import check_text


def whole_number(value: Any) -> Any:
    """A bool or a float with no fraction as the int it stands for, as vLLM's (lax) fields
    read them: max_tokens 16.0 is 16, logprobs true is 1; anything else as it came."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# a scalar count field: an int, a whole float or a bool (strings stay refused)
Count = Annotated[StrictInt, BeforeValidator(whole_number)]


def _first_bad_text(value: Any, path: str) -> tuple[str, str] | None:
    """(path, message) of the first string (or key) in value with no UTF-8 encoding."""
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    if isinstance(value, str):
        try:
            check_text(path or "body", value)
        except ValueError as exc:
            return path or "body", str(exc)
    for key, item in items:
        inner = f"{path}.{key}" if path else str(key)
        found = _first_bad_text(key, inner) if isinstance(key, str) else None
        found = found or _first_bad_text(item, inner)
        if found:
            return found
    return None


class RequestBody(BaseModel):
    """A request body: before any field is read, every string in it must be valid UTF-8
    (JSON can spell a lone surrogate, "\\ud800", which no tokenizer or grammar takes)."""

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        try:  # one C-speed pass; the walk that names the field only runs on a failure
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            path, message = _first_bad_text(data, "")
            raise PydanticCustomError("invalid_utf8", message, {"path": path}) from None
        except (TypeError, ValueError):
            pass  # not JSON data (built in Python): the fields' own types decide
        return data

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """A null for a field with a default that takes no None (n, stream, logprobs, the
        penalties ...) means that default, as vLLM's optional fields read it: clients send
        null for "unset". Fields where None has a meaning of its own keep it."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {key: value for key, value in data.items()
                if value is not None or key not in fields or fields[key].is_required()
                or type(None) in get_args(fields[key].annotation)}


class StreamOptions(BaseModel):
    """stream_options: whether a final chunk carries the usage, and whether every chunk
    does."""

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM: the usage so far on every chunk


class JsonSchemaFormat(BaseModel):
    """response_format.json_schema: the schema the output must match, under `schema`."""

    name: str = "schema"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class StructuralTagItem(BaseModel):
    """One structure of a (legacy) structural tag: begin, JSON of schema, end."""

    begin: str
    schema_: dict[str, Any] = Field(alias="schema")
    end: str


class ResponseFormat(BaseModel):
    """response_format: free text, any JSON object, JSON matching a schema, or vLLM's
    structural tag (structures and triggers, or xgrammar's format)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[StructuralTagItem] | None = None
    triggers: list[str] | None = None
    format: dict[str, Any] | None = None


class SamplingFields(RequestBody):
    """Fields shared by /v1/completions and /v1/chat/completions. Fields beyond these are
    kept in model_extra, where the API's own but unsupported ones are refused by name."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    model: str | None = None
    n: Count = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Count | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    presence_penalty: StrictFloat = 0.0
    frequency_penalty: StrictFloat = 0.0
    logit_bias: dict[str, StrictFloat] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM extras
    top_k: Count | None = None
    min_p: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    min_tokens: Count = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    allowed_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    prompt_logprobs: Count | None = None
    priority: Count = 0  # needs --scheduling-policy priority unless 0
    cache_salt: str | None = None  # only requests with the same salt share prefix-cache blocks
    return_token_ids: StrictBool = False
    # logprobs' tokens as "token_id:{id}"; None: the server's --return-tokens-as-token-ids
    return_tokens_as_token_ids: StrictBool | None = None
    spaces_between_special_tokens: StrictBool = True
    request_id: str | None = None  # vLLM's: the reply's id (else the X-Request-Id header's)


class CompletionRequest(SamplingFields):
    """The body of /v1/completions: one prompt or several, as text or token ids."""

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: Count | None = 16
    logprobs: Count | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: Count | None = None
    add_special_tokens: StrictBool = True


# content part types read as text, as vLLM reads them -> the key that holds their text
TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text",
                  "refusal": "refusal", "thinking": "thinking"}


class ContentPart(BaseModel):
    """One part of a message's content; only text parts (TEXT_PART_KEYS) are served (any
    other type is refused by name before the chat template runs)."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    refusal: str | None = None
    thinking: str | None = None

    def part_text(self) -> str | None:
        """The text of a text-like part (None: not one, or its text is missing)."""
        key = TEXT_PART_KEYS.get(self.type)
        return None if key is None else getattr(self, key)


class ChatMessage(BaseModel):
    """One chat message; content is a string or a list of text parts. Any non-empty role
    reaches the chat template (vLLM's custom message role: Llama 3's ipython, say)."""

    role: str = Field(min_length=1)
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # vLLM's newer name for reasoning_content (clients echo both)

    def text(self) -> str:
        """The content as one string (text parts joined by newlines, "" when absent)."""
        if isinstance(self.content, list):
            return join_text_parts(p.part_text() or "" for p in self.content)
        return self.content or ""

    def text_parts(self) -> list[dict[str, str]]:
        """The content as OpenAI text parts, each its own (a string is one; none for an
        empty or absent content)."""
        if isinstance(self.content, list):
            return [{"type": "text", "text": p.part_text() or ""} for p in self.content]
        return [{"type": "text", "text": self.content}] if self.content else []

    def template_input(self) -> dict[str, Any]:
        """The message as a chat template reads it: role, content and the fields it set."""
        extra = self.model_dump(include={"name", "tool_calls", "tool_call_id"},
                                exclude_none=True)
        thought = self.reasoning_content if self.reasoning_content is not None \
            else self.reasoning
        if thought is not None:  # templates read either name (Qwen3's: reasoning_content)
            extra["reasoning_content"] = extra["reasoning"] = thought
        return {"role": self.role, "content": self.text(), **extra}


class ChatCompletionRequest(SamplingFields):
    """The body of /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: StrictBool = False
    top_logprobs: Count | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    # vLLM's: the tokenizer's special tokens (a BOS) on top of what the template writes
    add_special_tokens: StrictBool = False
    echo: StrictBool = False  # vLLM: the reply starts with the last message, if it is its role
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    include_reasoning: StrictBool = True  # vLLM's: false leaves reasoning_content out
    # vLLM's: the template's reasoning_effort, and enable_thinking unless chat_template_kwargs
    # sets it (with_reasoning_effort)
    reasoning_effort: Literal[REASONING_EFFORTS] | None = None
    thinking_token_budget: Count | None = Field(
        default=None, validation_alias=AliasChoices("thinking_token_budget",
                                                    "max_thinking_tokens"))


class TokenizeRequest(RequestBody):
    """The body of /tokenize: a prompt, or messages rendered by the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(RequestBody):
    """The body of /detokenize."""

    model: str | None = None
    tokens: list[StrictInt]


class ModelPermission(BaseModel):
    """vLLM's (and OpenAI's legacy) permission object of a model card: sampling and logprobs
    allowed, nothing else."""

    id: str
    object: str = "model_permission"
    created: int
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    """One served model in /v1/models."""

    id: str
    object: str = "model"
    created: int
    owned_by: str = "compiled-llm"
    max_model_len: int
    root: str | None = None  # the base model's path (--model); an adapter's path
    parent: str | None = None  # an adapter's base model (None: a base model)
    permission: list[ModelPermission] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_permission(self) -> ModelCard:
        """vLLM lists one permission object per card; its id follows the card's, so that
        listing and retrieving a model answer the same card."""
        if not self.permission:
            digest = hashlib.sha256(self.id.encode()).hexdigest()[:32]
            self.permission = [ModelPermission(id=f"modelperm-{digest}", created=self.created)]
        return self


class ModelList(BaseModel):
    """The body /v1/models answers."""

    object: str = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    """The fields of an OpenAI error object."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The body of every error answer: {"error": {message, type, param, code}}."""

    error: ErrorInfo


class TokenizeResponse(BaseModel):
    """The body /tokenize answers."""

    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None  # with return_token_strs: each token's string


class DetokenizeResponse(BaseModel):
    """The body /detokenize answers."""

    prompt: str
