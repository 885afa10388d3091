"""Pure-Python engine core: requests, waiting queues and policies, the scheduler (and its
async subclass), the KV cache manager, block pool and prefix hashes. Never imports torch."""
