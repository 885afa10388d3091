"""What users call: LLM (offline), AsyncLLM (asyncio), the CLI and the OpenAI-compatible
server. Entry points use only the engine's public API."""
