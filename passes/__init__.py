"""Inductor graph passes: the pass manager, one file per pass, and the custom ops they emit."""

from compiled_llm.passes.manager import PassConfig, PassManager

__all__ = ["PassConfig", "PassManager"]
