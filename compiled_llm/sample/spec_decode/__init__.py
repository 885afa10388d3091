"""Speculative decoding on the device side: proposers behind one interface (a registry by
vLLM's method name) and the verifier (rejection sampling that keeps the target's distribution)."""
