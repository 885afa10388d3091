"""The OpenAI-compatible HTTP server (`compiled-llm serve`)."""
