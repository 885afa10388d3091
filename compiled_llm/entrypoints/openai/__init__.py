"""vLLM's `vllm.entrypoints.openai` module path (api_server), for scripts and images that start
the server as a module."""
