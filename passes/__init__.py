"""Inductor graph passes: the pass manager, one file per pass, and the custom ops they emit.
The manager (which imports Inductor's pattern matcher, and with it Dynamo) is imported on first
use, so that a weight loader importing only the ops (quant_ops) stays clear of the compiler."""

__all__ = ["PassConfig", "PassManager"]


def __getattr__(name: str):
    if name in __all__:
        from compiled_llm.passes import manager

        return getattr(manager, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
