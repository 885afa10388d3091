"""The pooling engine's compile settings: the fused QK-norm + RoPE + KV write (on by default for
generation) is off for pooling forwards, which have no KV cache, unless the user asks for it;
every other setting is the generation engine's."""

from __future__ import annotations

from compiled_llm.config import EngineArgs
from compiled_llm.engine.pooling_engine import QK_FUSION, pooling_compile_config


def test_qk_fusion_off_for_pooling_by_default():
    args = EngineArgs(model="unused", passes={"enable_silu_mul": False})
    config = pooling_compile_config(args)
    assert config.passes[QK_FUSION] is False and config.passes["enable_silu_mul"] is False
    generation = args.compile_config()
    assert QK_FUSION not in generation.passes  # generation keeps PassConfig's default (on)
    assert config.mode == generation.mode and config.cudagraph_mode == generation.cudagraph_mode


def test_qk_fusion_kept_when_asked_for():
    for asked in (True, False):
        config = pooling_compile_config(EngineArgs(model="unused", passes={QK_FUSION: asked}))
        assert config.passes[QK_FUSION] is asked


def test_o0_stays_off():
    config = pooling_compile_config(EngineArgs(model="unused", optimization_level=0))
    assert config.passes[QK_FUSION] is False and config.mode == "none"
