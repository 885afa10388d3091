"""QKNormRoPEKVWriteFusionPass on toy and model Dynamo graphs (match counts, op counts, the split,
numerics and written caches against eager), and through the engine against the pass turned off."""

from __future__ import annotations

import operator
from collections import Counter

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.attention import attention
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.compile import counters
from compiled_llm.compile.split import split_graph
from compiled_llm.models.layers import rms_norm
from compiled_llm.models.rotary import apply_rotary
from compiled_llm.passes import PassConfig, PassManager
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import model_inputs, prefill_context
from tests.utils import make_checkpoint

PASS = "QKNormRoPEKVWriteFusionPass"
H, HKV, D = 4, 2, 16
# the pass is opt-in, and fires on CUDA tensors only unless told otherwise
ON_CPU = {"qk_norm_rope_kv_write_on_cpu": True, "enable_qk_norm_rope_kv_write": True}


def dynamo_counts(graph: torch.fx.Graph) -> Counter:
    """Calls per custom op ("compiled_llm.attention") and per torch function ("rsqrt")."""
    counts = Counter()
    for node in graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if isinstance(node.target, torch._ops.OpOverload):
            counts[node.target.name().split(".")[0].replace("::", ".")] += 1
        else:
            counts[getattr(node.target, "__name__", str(node.target))] += 1
    return counts


def pre_split_run(fn, args, ctx_factory, config: PassConfig | None = None):
    """(output, eager output, counts before, after, split pieces, manager, contexts): fn
    compiled by a backend running only the pre-split passes, against fn run eagerly; each run
    under a fresh context from ctx_factory (returned too, to compare the written caches)."""
    torch._dynamo.reset()
    manager, seen = PassManager(config or PassConfig(**ON_CPU)), {}

    def backend(gm, example_inputs):
        seen["before"] = dynamo_counts(gm.graph)
        manager.pre_split(gm.graph)
        gm.recompile()
        seen["after"] = dynamo_counts(gm.graph)
        seen["pieces"] = split_graph(gm)[1]
        return gm.forward

    eager_ctx, ctx = ctx_factory(), ctx_factory()
    with set_forward_context(eager_ctx):
        ref = fn(*args)
    with set_forward_context(ctx):
        out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return out, ref, seen["before"], seen["after"], seen["pieces"], manager, (eager_ctx, ctx)


def layer(qkv, cos, sin, q_w, k_w, layer_idx=0):
    """One attention block spelled as the models spell it (q/k norms when weights are given)."""
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    q, k, v = q.view(-1, H, D), k.view(-1, HKV, D), v.view(-1, HKV, D)
    if q_w is not None:
        q, k = rms_norm(q, q_w, 1e-6), rms_norm(k, k_w, 1e-6)
    q, k = apply_rotary(q, k, (cos, sin))
    return attention(q, k, v, layer_idx, D**-0.5, -1)


def toy_inputs(num_tokens: int, dtype: torch.dtype, norms: bool):
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(num_tokens, (H + 2 * HKV) * D, generator=gen).to(dtype)
    angles = torch.randn(num_tokens, 1, D // 2, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    weights = (1 + 0.1 * torch.randn(2, D, generator=gen)).to(dtype) if norms else (None, None)
    return qkv, cos, sin, weights[0], weights[1]


class _Toy:
    config = type("Cfg", (), {"num_key_value_heads": HKV, "head_dim": D, "num_hidden_layers": 2})


def toy_context(num_tokens: int, dtype: torch.dtype):
    return lambda: prefill_context(_Toy.config, num_tokens, dtype)


def _assert_same(out, ref, contexts, exact: bool = True):
    tol = {"rtol": 0, "atol": 0} if exact else {}
    torch.testing.assert_close(out, ref, **tol)
    for written, expected in zip(contexts[1].kv_caches, contexts[0].kv_caches):
        torch.testing.assert_close(written, expected, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norms", [True, False])
def test_toy_layer_fuses_once_and_matches_eager(dtype, norms):
    args = toy_inputs(9, dtype, norms)
    out, ref, before, after, pieces, m, ctxs = pre_split_run(layer, args, toy_context(9, dtype))
    assert m.matches(PASS) == 1
    assert before["compiled_llm.attention"] == 1 and after["compiled_llm.attention"] == 0
    assert after["compiled_llm.qk_norm_rope_attention"] == 1
    assert after["compiled_llm.qk_norm_rope_kv_write"] == 0
    assert after["compiled_llm.attention_no_write"] == 0
    assert before["rsqrt"] == (2 if norms else 0) and after["rsqrt"] == 0
    assert before["cat"] == 2 and after["cat"] == 0  # each rotation's cat is gone
    # the fused op is one split region
    assert [p.is_split_op for p in pieces] == [False, True]
    _assert_same(out, ref, ctxs)


def test_two_layers_and_a_site_that_does_not_fit():
    def fn(qkv, cos, sin, q_w, k_w):
        first = layer(qkv, cos, sin, q_w, k_w, 0)
        q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
        q, k, v = q.view(-1, H, D), k.view(-1, HKV, D), v.view(-1, HKV, D)
        q, _ = apply_rotary(q, k, (cos, sin))  # k not rotated: left as it is
        return first, attention(q, k, v, 1, D**-0.5, -1)

    args = toy_inputs(6, torch.float32, True)
    out, ref, _, after, pieces, m, ctxs = pre_split_run(fn, args, toy_context(6, torch.float32))
    assert m.matches(PASS) == 1
    assert after["compiled_llm.attention"] == 1
    assert after["compiled_llm.qk_norm_rope_attention"] == 1
    assert sum(p.is_split_op for p in pieces) == 2
    _assert_same(out, ref, ctxs)


def test_rotated_q_read_elsewhere_is_kept_for_that_reader():
    def fn(qkv, cos, sin, q_w, k_w):
        q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
        q, k, v = q.view(-1, H, D), k.view(-1, HKV, D), v.view(-1, HKV, D)
        q, k = apply_rotary(q, k, (cos, sin))
        return attention(q, k, v, 0, D**-0.5, -1), q.sum()

    args = toy_inputs(5, torch.float32, False)
    out, ref, _, after, _, m, ctxs = pre_split_run(fn, args, toy_context(5, torch.float32))
    assert m.matches(PASS) == 1 and after["cat"] == 1  # q's rotation stays for q.sum()
    _assert_same(out, ref, ctxs)


def test_pass_off_default_on_cpu_and_the_uncached_path():
    args = toy_inputs(7, torch.float32, True)
    for off in (PassConfig(**{**ON_CPU, "enable_qk_norm_rope_kv_write": False}), PassConfig()):
        *_, after, _, m, _ = pre_split_run(layer, args, toy_context(7, torch.float32), off)
        assert m.matches(PASS) == 0 and after["compiled_llm.attention"] == 1
    no_cache = toy_context(7, torch.float32)
    uncached = lambda: ForwardContext(no_cache().attn_metadata)  # noqa: E731 (pooling runs)
    out, ref, _, _, _, m, _ = pre_split_run(layer, args, uncached)
    assert m.matches(PASS) == 1
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_fp8_cache_calibrates_from_rotated_rows_and_writes_them():
    def fp8_context():
        ctx = toy_context(8, torch.float32)()
        ctx.kv_caches = [c.to(torch.float8_e4m3fn) for c in ctx.kv_caches]
        ctx.kv_scales, ctx.calibrate_kv_scales = torch.ones(2, 2, HKV), True
        return ctx

    args = toy_inputs(8, torch.float32, True)
    out, ref, _, _, _, m, ctxs = pre_split_run(layer, args, fp8_context)
    assert m.matches(PASS) == 1
    torch.testing.assert_close(ctxs[1].kv_scales, ctxs[0].kv_scales, rtol=0, atol=0)
    assert not torch.equal(ctxs[1].kv_scales, torch.ones(2, 2, HKV))
    for written, expected in zip(ctxs[1].kv_caches, ctxs[0].kv_caches):
        assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_model_graph_fuses_once_per_layer(name):
    model = load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512)
    layers, norms = model.config.num_hidden_layers, 2 if name == "qwen3" else 0
    ids, pos = model_inputs(model, 10)
    contexts = lambda: prefill_context(model.config, 10, torch.float32)  # noqa: E731
    out, ref, before, after, pieces, m, ctxs = pre_split_run(model, (ids, pos), contexts)
    assert m.matches(PASS) == layers
    assert after["compiled_llm.qk_norm_rope_attention"] == layers
    assert after["compiled_llm.attention"] == 0
    assert before["rsqrt"] - after["rsqrt"] == norms * layers  # q/k norms went into the op
    assert before["cat"] - after["cat"] == 2 * layers  # each q and k rotation
    assert len(pieces) == 2 * layers + 1 and sum(p.is_split_op for p in pieces) == layers
    _assert_same(out, ref, ctxs)


def engine_runs(monkeypatch, name: str, params: SamplingParams, **engine) -> dict:
    """{pass enabled: first completions} of three prompts, the pass on and off, each with a
    fresh compile; asserts the pass fired once a layer and the KV pool is empty after."""
    monkeypatch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")  # the pass must really run
    ckpt = str(make_checkpoint(name))
    prompts = [{"prompt_token_ids": [3 + i, 17, 5 * i + 1, 40, 2] * (i + 1)} for i in range(3)]
    runs = {}
    for enabled in (False, True):
        counters.reset()
        llm = LLM(ckpt, compile_mode="backend", engine_core_process=False,
                  passes={**ON_CPU, "enable_qk_norm_rope_kv_write": enabled}, **engine)
        runs[enabled] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        assert counters.pass_matches.get(PASS, 0) == (2 if enabled else 0)  # once a layer
        assert llm.engine.num_used_blocks == 0
        del llm
    return runs


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_engine_greedy_tokens_and_logprobs_equal_the_pass_off(monkeypatch, kv_cache_dtype):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    runs = engine_runs(monkeypatch, "qwen3", params, dtype="float32",
                       kv_cache_dtype=kv_cache_dtype)
    for fused, plain in zip(runs[True], runs[False]):
        assert fused.token_ids == plain.token_ids
        for fused_step, plain_step in zip(fused.logprobs, plain.logprobs):
            for token, entry in plain_step.items():
                assert abs(fused_step[token].logprob - entry.logprob) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["llama", "qwen3"])
@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise"])
def test_engine_on_gpu_with_cuda_graphs_equals_the_pass_off(monkeypatch, name, mode):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runs = engine_runs(monkeypatch, name, params, dtype="float32", cudagraph_mode=mode,
                       gpu_memory_utilization=0.3)
    assert [o.token_ids for o in runs[True]] == [o.token_ids for o in runs[False]]
