"""Serving's own engine defaults: the prefill cap on unless the user set it (0 turns it off),
and the offline LLM without it."""

from __future__ import annotations

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.cli.serve import SERVE_MAX_DECODE_SLOWDOWN, serving_defaults


def test_serve_caps_prefill_by_default():
    args = serving_defaults(EngineArgs())
    assert args.max_decode_slowdown == SERVE_MAX_DECODE_SLOWDOWN
    assert args.scheduler_config(4096).max_decode_slowdown == SERVE_MAX_DECODE_SLOWDOWN


def test_a_user_setting_wins():
    assert serving_defaults(EngineArgs(max_decode_slowdown=4.0)).max_decode_slowdown == 4.0
    off = serving_defaults(EngineArgs(max_decode_slowdown=0))
    assert off.scheduler_config(4096).max_decode_slowdown is None


def test_offline_has_no_cap():
    assert EngineArgs().scheduler_config(4096).max_decode_slowdown is None
