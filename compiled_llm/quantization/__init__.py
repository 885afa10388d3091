"""Load-time quantization transforms applied to a loaded model from outside it."""

from compiled_llm.quantization.fp8 import Fp8Linear, quantize_model

__all__ = ["Fp8Linear", "quantize_model"]
