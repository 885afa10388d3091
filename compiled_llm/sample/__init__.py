"""Sampling on the device: the sampler and the per-request state it keeps (seeded generators),
the batch view of SamplingParams, logprobs, and structured outputs (xgrammar)."""
