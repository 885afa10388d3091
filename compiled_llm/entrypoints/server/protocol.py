"""Request and response bodies of the OpenAI-compatible API (pydantic), with vLLM's extras.

Types are checked here; value ranges are checked once, by SamplingParams, so the rules live in
one place. Unknown fields are ignored, as OpenAI's own server does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class JsonSchemaFormat(BaseModel):
    name: str = "schema"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(populate_by_name=True)

    model: str | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM extras
    top_k: StrictInt | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: StrictInt = 0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[StrictInt]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "compiled-llm"
    max_model_len: int


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]
