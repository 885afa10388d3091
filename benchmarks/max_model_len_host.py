"""Host time of one decode step's input fill (InputBatch.prepare, warm loop) against
max_model_len, on the demo model claiming 131072 positions: a step gathers only the block-table
columns its longest sequence needs, so the time should not move with max_model_len.

    python -m benchmarks.max_model_len_host --batch 64 --lens 2048 131072
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from benchmarks.host_step import warm_prepare_us
from compiled_llm import LLM
from compiled_llm.engine.llm_engine import DEMO_MODEL


def long_demo_model(positions: int) -> str:
    """A copy of the demo model whose config.json claims `positions` positions."""
    out = Path(tempfile.mkdtemp(prefix="cllm-long-demo-"))
    for path in DEMO_MODEL.iterdir():
        shutil.copy(path, out / path.name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions}))
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--lens", type=int, nargs="+", default=[2048, 131072])
    ap.add_argument("--reps", type=int, default=500)
    args = ap.parse_args()
    model = long_demo_model(max(args.lens))
    for max_len in args.lens:
        # KV for one sequence of the longest length, and no more (CPU memory)
        llm = LLM(model, enforce_eager=True, max_model_len=max_len, enable_prefix_caching=False,
                  kv_cache_memory_bytes=(max(args.lens) // 16 + 2) * 16384)
        us = warm_prepare_us(llm.engine, args.batch, args.prompt_len, args.reps)
        batch = llm.engine.executor.worker.runner.input_batch
        width = getattr(batch, "table_width", batch.max_blocks)
        print(f"max_model_len {max_len:7d}: prepare() {us:7.1f} us, block table gathered "
              f"{width} of {batch.max_blocks} columns ({4 * width * args.batch} bytes)")
        llm.engine.shutdown()


if __name__ == "__main__":
    main()
