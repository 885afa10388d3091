"""The gpt-fast peer on CPU: converted weights give gpt-fast's own Transformer the logits that
transformers gives (prefill and a cached decode step), shapes and dtypes gpt-fast lacks are
refused, and decode_latency --peer gptfast runs gpt-fast's generate.py end to end. Skipped where
gpt-fast's tree is not in .peer/gpt-fast (it is fetched, never committed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import gptfast_peer
from benchmarks.common import SHAPES
from tests.benchmarks.conftest import ROOT, run_benchmark

pytestmark = pytest.mark.skipif(not (gptfast_peer.PEER_DIR / "generate.py").is_file(),
                                reason="gpt-fast is not in .peer/gpt-fast")

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
            rope_theta=500000.0, initializer_range=0.1)


def _tokenizer_packages() -> None:
    """Skip unless both packages gpt-fast's tokenizer.py imports are installed ('.[bench]')."""
    pytest.importorskip("sentencepiece")
    pytest.importorskip("tiktoken")


def _config(shape: str) -> dict:
    """The config.json transformers writes for a named benchmark shape."""
    import transformers

    kwargs = dict(SHAPES[shape])
    return json.loads(getattr(transformers, kwargs.pop("arch"))(**kwargs).to_json_string())


def test_converted_weights_give_transformers_logits():
    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    model = gptfast_peer.load_peer_module("model")
    args = model.ModelArgs(block_size=64, vocab_size=512, n_layer=2, n_head=4, n_local_heads=2,
                           dim=64, intermediate_size=160, rope_base=500000.0)
    peer = model.Transformer(args)
    peer.load_state_dict(gptfast_peer.convert_state_dict(hf.state_dict(), args))  # strict
    peer.setup_caches(max_batch_size=1, max_seq_length=16)
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        want = hf(ids).logits
        prefill = peer(ids[:, :11], torch.arange(11))
        step = peer(ids[:, 11:], torch.tensor([11]))  # reads the KV cache the prefill wrote
    assert want.abs().max() > 0.1  # logits large enough for the tolerance to mean something
    torch.testing.assert_close(prefill, want[:, :11], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(step, want[:, 11:], atol=1e-4, rtol=1e-4)


def test_shapes_map_to_gptfast_configs_or_are_refused():
    assert gptfast_peer.gptfast_name(_config("llama3-8b")) == "llama-3-8b"
    assert gptfast_peer.gptfast_name(_config("stories15m")) == "stories15M"
    with pytest.raises(ValueError, match="model_type='qwen3'"):
        gptfast_peer.gptfast_name(_config("qwen3-0.6b"))
    with pytest.raises(ValueError, match="no gpt-fast config has this shape"):
        gptfast_peer.gptfast_name(_config("cpu-small"))
    with pytest.raises(ValueError, match="dtype='float32'"):
        gptfast_peer.decode("unused", "float32", "none", [1], 16, 8)


def test_made_up_tokenizer_decodes_every_id(tmp_path):
    _tokenizer_packages()
    path = tmp_path / "llama-3-test" / "tokenizer.model"
    path.parent.mkdir()
    gptfast_peer.write_tokenizer(path, 1000)
    tok = gptfast_peer.load_peer_module("tokenizer").get_tokenizer(path, path.parent)
    assert (tok.bos_id(), tok.eos_id()) == (744, 745)  # the specials follow 744 byte tokens
    assert len(tok.decode(list(range(1000)))) > 0


def test_decode_latency_refuses_gptfast_for_qwen3():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.decode_latency", "--shape",
                           "qwen3-0.6b", "--peer", "gptfast", "--dtype", "bfloat16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Llama only, not --shape qwen3-0.6b" in proc.stderr


def test_decode_latency_with_gptfast_peer(tmp_path, ckpt_root):
    _tokenizer_packages()
    res = run_benchmark("decode_latency", tmp_path, ckpt_root, "--peer", "gptfast",
                        "--scheduling", "sync", "--prompt-len", "16", "--new-tokens", "8",
                        "--gptfast-samples", "2", shape="stories15m", dtype="bfloat16")
    peer, ours = res["rows"]
    assert peer["engine"] == "gpt-fast (eager)" and peer["ratio"] == 1.0
    assert peer["raw"]["config"] == "stories15M"
    row = peer["raw"]["rows"][0]
    assert row["prompt_len"] == 16 and len(row["samples_tok_s"]) == 2
    assert row["tok_s"] == row["average_tok_s"] > 0 and len(row["bandwidth_gbs"]) == 2
    assert ours["engine"] == "compiled-llm (none)" and ours["decode tok/s"] > 0
