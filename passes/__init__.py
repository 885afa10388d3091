"""Inductor graph passes (installed as compiled_llm.passes)."""
