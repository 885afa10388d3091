"""The cold start's side-by-side Triton compiles (GPU only): after the dry pass, profiling,
warm-up and capture compile no kernel, and the engine's tokens equal those of an engine that
compiled each kernel at its first launch."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.worker import precompile
from tests.utils import make_checkpoint, random_prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _generate(ckpt, cache_dir, prompts) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = LLM(str(ckpt), engine_core_process=False, dtype="bfloat16", max_num_seqs=16,
              gpu_memory_utilization=0.4, compile_cache_dir=str(cache_dir))
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert llm.engine.num_used_blocks == 0
    llm.shutdown()
    return outs


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_cold_start_compiles_side_by_side(tmp_path, monkeypatch, caplog):
    ckpt = make_checkpoint("qwen3_deep")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(5, 300, lo=2, hi=60, seed=3)]
    monkeypatch.setenv(precompile.ENV, "0")
    ref = _generate(ckpt, tmp_path / "off", prompts)
    monkeypatch.delenv(precompile.ENV)
    with caplog.at_level(logging.INFO, logger="compiled_llm.worker"):
        got = _generate(ckpt, tmp_path / "on", prompts)
    assert got == ref
    text = caplog.text
    assert "Triton kernels compiled side by side" in text and "(0 failed)" in text
    phases = re.search(r"compiled during start-up: (.*?) \(cache dirs", text).group(1)
    assert "precompile" in phases
    assert re.search(r"profile 0, warmup 0, capture 0", phases), phases
