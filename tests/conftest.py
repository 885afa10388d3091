"""Session set-up: on a GPU, many engines live in one test process, so each gets a small
fixed KV budget instead of a share of the device."""

import os

import torch

if torch.cuda.is_available():
    os.environ.setdefault("COMPILED_LLM_KV_CACHE_MEMORY_BYTES", str(256 << 20))
