"""Seed-OSS calls: Qwen3-Coder's XML (<function=NAME><parameter=KEY>VALUE</parameter>...
</function>) inside <seed:tool_call>...</seed:tool_call> blocks, typed the same way."""

from __future__ import annotations

from compiled_llm.entrypoints.tool_parsers.qwen3_coder import Qwen3CoderToolParser


class SeedOssToolParser(Qwen3CoderToolParser):
    """`<seed:tool_call>\\n<function=f>\\n<parameter=x>1</parameter>\\n</function>\\n
    </seed:tool_call>`."""

    name = "seed_oss"
    start, end = "<seed:tool_call>", "</seed:tool_call>"
    skip_special_tokens = False  # the tags are special tokens in Seed-OSS's tokenizer
