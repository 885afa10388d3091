"""The request body of /v1/responses (pydantic): OpenAI's Responses fields on top of the
sampling fields the other endpoints share (vLLM's extras: seed, stop, top_k ...). Fields this
server cannot honour are declared so that a request setting them is refused by name."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, StrictBool

from compiled_llm.entrypoints.server.protocol import Count, SamplingFields


class TextFormat(BaseModel):
    """text.format: free text, any JSON object, or JSON matching `schema` (named `name`)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(BaseModel):
    """text: the output's format; verbosity is a hint this server has no way to follow."""

    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesStreamOptions(BaseModel):
    """stream_options of /v1/responses; no obfuscation padding is ever added to events."""

    include_obfuscation: StrictBool = True


class ResponsesRequest(SamplingFields):
    """The body of /v1/responses. `store` (true unless false) keeps the finished response
    for a later previous_response_id (responses_store.py); conversation objects are
    refused."""

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Count | None = None
    text: TextConfig | None = None
    store: StrictBool | None = None
    stream_options: ResponsesStreamOptions | None = None  # type: ignore[assignment]
    include: list[str] | None = None
    top_logprobs: Count | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    tools: list[dict[str, Any]] | None = None  # function tools, Responses' flat shape
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extra (enable_thinking ...)
    thinking_token_budget: Count | None = Field(  # as on chat: ends the thinking span
        default=None, validation_alias=AliasChoices("thinking_token_budget",
                                                    "max_thinking_tokens"))
    # refused unless unset (each needs state or a tool runtime this server does not have)
    max_tool_calls: Count | None = None
    previous_response_id: str | None = None  # honoured: a stored response's id
    conversation: str | dict[str, Any] | None = None
    background: StrictBool | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
