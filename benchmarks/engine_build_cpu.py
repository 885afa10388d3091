"""Median LLM(...) construction time on the CPU in one process (after a first, warming build),
for the tree as it is ("now") or with three start-up costs put back in place ("before": a
memset KV cache, every KV block made up front, a full collection after every build):
`PYTHONPATH=. python benchmarks/engine_build_cpu.py before|now`."""

import json
import statistics
import sys
import time

import torch

import compiled_llm.core.block_pool as block_pool
import compiled_llm.engine.llm_engine as llm_engine
import compiled_llm.worker.kv_cache as kv_cache
from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint

if sys.argv[1] == "before":
    kv_cache._zeros = lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device)
    llm_engine.imported_a_library = lambda before: True

    class EagerBlocks(list):
        """Every KVBlock made at once."""

        def __init__(self, count):
            super().__init__(block_pool.KVBlock(i) for i in range(count))
    block_pool.LazyBlocks = EagerBlocks

ckpt = str(make_checkpoint("llama"))
P = SamplingParams(temperature=0.0, max_tokens=4)
times = []
for _ in range(9):
    start = time.perf_counter()
    llm = LLM(ckpt, enforce_eager=True, dtype="float32")
    times.append(time.perf_counter() - start)
    llm.generate([[5, 9, 17, 3]], P, use_tqdm=False)
    llm.shutdown()
    del llm
print(json.dumps({"tree": sys.argv[1], "first_s": round(times[0], 3),
                  "median_later_s": round(statistics.median(times[1:]), 3)}))
