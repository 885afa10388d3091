"""Request bodies of the pooling endpoints (pydantic), as OpenAI and vLLM spell them:
/v1/embeddings, /pooling, /v1/score and /v1/rerank. Types are checked here; values (lengths,
dimensions, truncation) by the engine, whose ValueError names the field."""

from __future__ import annotations

from typing import Literal

from pydantic import StrictInt, StrictStr

from compiled_llm.entrypoints.server.protocol import RequestBody

# OpenAI's input: one text, texts, one token-id list, or token-id lists
EmbeddingInput = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class EmbeddingRequest(RequestBody):
    """POST /v1/embeddings (and /pooling, which answers the pooler's raw output)."""

    model: str | None = None
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None
    truncate_prompt_tokens: StrictInt | None = None  # vLLM's extra
    normalize: bool | None = None  # vLLM's extra: None keeps the model's setting


class ScoreRequest(RequestBody):
    """POST /v1/score: text_1 against each text_2 (or the two lists zipped)."""

    model: str | None = None
    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]
    truncate_prompt_tokens: StrictInt | None = None


class RerankRequest(RequestBody):
    """POST /v1/rerank (Jina and Cohere shape): documents ordered by relevance to query."""

    model: str | None = None
    query: StrictStr
    documents: list[StrictStr]
    top_n: StrictInt | None = None
    return_documents: bool = True
    truncate_prompt_tokens: StrictInt | None = None
