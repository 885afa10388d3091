"""The worker: loads the model, owns every device tensor (weights, KV cache, step inputs, CUDA
graphs and their memory pool) and runs one step through the model runner."""
