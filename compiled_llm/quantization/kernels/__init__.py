"""Triton kernels for quantized linears (W4A16 GEMM and split-K GEMV); loaded on first use."""
