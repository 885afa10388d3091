"""A tiny random Qwen3-style checkpoint whose tokenizer has the tool-call and thinking tags
(<tool_call>, </tool_call>, <think>, </think>, each one token) and a chat template that
renders tools, tool calls, tool results and reasoning (thinking only with
enable_thinking=True); and a live server on it with hermes tool calls and qwen3 reasoning."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch

from tests.entrypoints.server.conftest import start_server, stop_server
from tests.utils import SMALL, tokenizer_dir

TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content }}
{%- for call in m.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking %}<think>
{% else %}<think>

</think>

{% endif %}{% endif %}"""


@functools.cache
def tool_checkpoint() -> Path:
    """The checkpoint's directory (built once per session)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens(TAGS)  # not special: they stay in the text, as Qwen's do
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATE
    cfg = transformers.Qwen3Config(vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                   bos_token_id=None, head_dim=32, tie_word_embeddings=True,
                                   **{**SMALL, "max_position_embeddings": 4096})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    out = Path(tempfile.mkdtemp(prefix="cllm-tools-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tool_server():
    """A server on tool_checkpoint() with hermes tool calls and qwen3 reasoning."""
    proc, srv = start_server(tool_checkpoint(), "--enable-auto-tool-choice",
                             "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
    yield srv
    stop_server(proc)


@pytest.fixture(scope="session")
def tool_client(tool_server):
    """The official openai client on tool_server."""
    import openai

    return openai.OpenAI(base_url=f"{tool_server.url}/v1", api_key="none", max_retries=0,
                         timeout=120)
