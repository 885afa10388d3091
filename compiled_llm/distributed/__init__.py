"""Tensor parallelism: process groups, functional collectives and the load-time transform that
shards a built model over the ranks of its group."""
