"""Multi-LoRA through LLM, compiled (fullgraph, T dynamic): a batch mixing two adapters and the
base model gives transformers + peft's greedy tokens with each adapter merged; more adapters
than slots page through the LRU pool; the adapter id separates prefix-cache blocks; bad
adapters are refused per request with the engine serving on and no KV block held; vLLM's
add_lora, list_loras and remove_lora on LLMEngine and AsyncLLM (pin_lora refused)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from compiled_llm import LLM, LoRARequest, SamplingParams
from tests.lora.helpers import make_adapter, merged_greedy, with_config
from tests.utils import make_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14], [20, 21, 22, 23, 24, 25, 26], [40, 41, 42]]


@pytest.fixture(scope="module")
def base():
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def adapters(base):
    """Three adapters: all projections with rsLoRA, attention q/v + down only, and MLP only."""
    return [make_adapter(base, 1, rank=8, use_rslora=True),
            make_adapter(base, 2, rank=4, targets=("q_proj", "v_proj", "down_proj")),
            make_adapter(base, 3, rank=16, targets=("gate_proj", "up_proj"), alpha=8)]


@pytest.fixture(scope="module")
def llm(base):
    with LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=2,
             dtype="float32") as engine:
        yield engine


def _lora(index: int, path: Path) -> LoRARequest:
    return LoRARequest(f"adapter{index}", index, str(path))


def _run(llm, prompts, loras):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                        use_tqdm=False, lora_request=loras)
    assert llm.engine.num_used_blocks == 0
    return [list(o.outputs[0].token_ids) for o in outs]


def _manager(llm):
    return llm.engine.executor.worker.runner.lora


def test_mixed_batch_matches_peft_merged(llm, base, adapters):
    paths = [adapters[0], None, adapters[1], adapters[0]]
    loras = [None if p is None else _lora(i + 1 if i < 3 else 1, p) for i, p in enumerate(paths)]
    loras[2] = _lora(2, adapters[1])
    want = [merged_greedy(base, p, [prompt], 6)[0] for prompt, p in zip(PROMPTS, paths)]
    assert _run(llm, PROMPTS, loras) == want
    assert want[0] != merged_greedy(base, None, PROMPTS[:1], 6)[0]  # the adapter matters


def test_chat_takes_a_lora_request(llm, adapters):
    messages = [{"role": "user", "content": "The quick brown fox"}]
    tuned = llm.chat(messages, GREEDY, use_tqdm=False, lora_request=_lora(1, adapters[0]))
    plain = llm.chat(messages, GREEDY, use_tqdm=False)
    assert tuned[0].outputs[0].token_ids != plain[0].outputs[0].token_ids


def test_more_adapters_than_slots_page_through_lru(llm, base, adapters):
    manager = _manager(llm)
    loras = [_lora(1, adapters[0]), _lora(2, adapters[1]), _lora(3, adapters[2]),
             _lora(3, adapters[2])]
    loads = manager.loads
    got = _run(llm, PROMPTS, loras)
    want = [merged_greedy(base, path, [prompt], 6)[0]
            for prompt, path in zip(PROMPTS, [adapters[0], adapters[1], adapters[2],
                                              adapters[2]])]
    assert got == want
    assert manager.loads > loads and len(manager.resident()) <= 2
    _run(llm, PROMPTS[:1], None)  # its step releases the finished requests' adapters
    assert not manager.live


def test_adapter_id_separates_prefix_cache(llm, base, adapters):
    prompt = list(range(60, 100))  # two full blocks of 16 and change
    stats = llm.engine.prefix_cache_stats
    hits = stats.hit_tokens
    first = _run(llm, [prompt], [_lora(1, adapters[0])])
    other = _run(llm, [prompt], [_lora(2, adapters[1])])
    assert stats.hit_tokens == hits  # another adapter: no block shared
    again = _run(llm, [prompt], [_lora(1, adapters[0])])
    assert stats.hit_tokens > hits and again == first
    assert other == merged_greedy(base, adapters[1], [prompt], 6)


def test_regex_targets_and_a_path_object(llm, base):
    """PEFT keeps a str target_modules as its regex (e.g. r".*\\.(q_proj|v_proj)"); vLLM loads
    such adapters by their tensors, and takes lora_path as a pathlib.Path too."""
    adapter = make_adapter(base, 40, rank=4, targets=r".*\.(q_proj|down_proj)")
    lora = LoRARequest("regex", 40, adapter)  # a Path, not a str
    assert lora.lora_path == str(adapter)
    assert _run(llm, PROMPTS[:1], [lora]) == merged_greedy(base, adapter, PROMPTS[:1], 6)



@pytest.mark.parametrize("case", ["patterns", "pickled"])
def test_per_module_rank_and_alpha_and_a_pickled_adapter(llm, base, case):
    """PEFT's rank_pattern / alpha_pattern give some modules their own r and lora_alpha (so
    their own scaling), and save_pretrained(safe_serialization=False) writes
    adapter_model.bin: both load (vLLM reads .bin too) and match peft's merged model."""
    adapter = {
        "patterns": lambda: make_adapter(base, 41, rank=8, use_rslora=True,
                                         targets=("q_proj", "v_proj", "down_proj"),
                                         rank_pattern=(("v_proj", 4), ("down_proj", 16)),
                                         alpha_pattern=((r"layers\.1\.self_attn\.q_proj", 2),)),
        "pickled": lambda: make_adapter(base, 42, rank=4, targets=("k_proj", "up_proj"),
                                        safe=False),
    }[case]()
    lora = LoRARequest(case, 41 if case == "patterns" else 42, str(adapter))
    assert _run(llm, PROMPTS, [lora] * len(PROMPTS)) == merged_greedy(base, adapter, PROMPTS, 6)

def _damaged(path: Path) -> Path:
    out = Path(tempfile.mkdtemp(prefix="cllm-lora-bad-"))
    shutil.copytree(path, out, dirs_exist_ok=True)
    weights = out / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return out


@pytest.mark.parametrize("case", ["rank", "targets", "damaged", "missing", "id_reused",
                                  "type", "targets_type", "alpha_type"])
def test_bad_adapter_is_refused_and_engine_serves_on(llm, base, adapters, case):
    lora = {
        "rank": lambda: _lora(10, make_adapter(base, 10, rank=32)),
        "targets": lambda: _lora(11, make_adapter(base, 11, targets=("lm_head",))),
        "damaged": lambda: _lora(12, _damaged(adapters[0])),
        "missing": lambda: _lora(13, "/nonexistent/adapter"),
        "id_reused": lambda: _lora(1, adapters[1]),
        "type": lambda: "adapter1",
        # malformed adapter_config.json fields: a ValueError too, not a TypeError
        "targets_type": lambda: _lora(14, with_config(adapters[0], target_modules=5)),
        "alpha_type": lambda: _lora(15, with_config(adapters[0], lora_alpha=None)),
    }[case]()
    field = {"rank": "max_lora_rank", "targets": "target_modules", "id_reused": "lora_int_id",
             "type": "lora_request", "targets_type": "target_modules"}.get(case, "lora_path")
    with pytest.raises(ValueError, match=field):
        llm.generate([{"prompt_token_ids": PROMPTS[0]}], GREEDY, use_tqdm=False,
                     lora_request=lora)
    assert not llm.engine.has_unfinished_requests() and llm.engine.num_used_blocks == 0
    assert _run(llm, PROMPTS[:1], [_lora(2, adapters[1])]) == merged_greedy(
        base, adapters[1], PROMPTS[:1], 6)


def test_adapter_lost_after_its_check_fails_its_requests_only(llm, base, adapters):
    lost = Path(tempfile.mkdtemp(prefix="cllm-lora-lost-"))
    shutil.copytree(adapters[2], lost, dirs_exist_ok=True)
    _run(llm, PROMPTS[:1], [_lora(30, lost)])  # checked and loaded
    shutil.rmtree(lost)
    _run(llm, PROMPTS[:2], [_lora(1, adapters[0]), _lora(2, adapters[1])])  # evicts it
    manager = _manager(llm)
    assert 30 not in manager.resident()
    manager._host.pop(30, None)  # out of the host cache too, as max_cpu_loras would in time
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], GREEDY, use_tqdm=False,
                        lora_request=[_lora(30, lost), None])
    assert outs[0].outputs[0].finish_reason == "error" and "lora_path" in outs[0].error
    assert list(outs[1].outputs[0].token_ids) == merged_greedy(base, None, PROMPTS[1:2], 6)[0]
    assert llm.engine.num_used_blocks == 0


def test_lora_request_without_enable_lora_is_refused(base, adapters):
    with LLM(str(base), enforce_eager=True, dtype="float32") as plain:
        with pytest.raises(ValueError, match="lora_request: LoRA is not enabled"):
            plain.generate([PROMPTS[0]], GREEDY, use_tqdm=False,
                           lora_request=_lora(1, adapters[0]))
        assert plain.engine.num_used_blocks == 0
        assert len(plain.generate([PROMPTS[0]], GREEDY, use_tqdm=False)) == 1


@pytest.mark.parametrize(("kwargs", "field"), [({"max_loras": 0}, "max_loras"),
                                               ({"max_lora_rank": -1}, "max_lora_rank"),
                                               ({"max_cpu_loras": 0}, "max_cpu_loras"),
                                               ({"max_loras": 3, "max_cpu_loras": 2},
                                                "max_cpu_loras"),
                                               ({"lora_dtype": "float16"}, "lora_dtype"),
                                               ({"fully_sharded_loras": 1},
                                                "fully_sharded_loras")])
def test_bad_lora_settings_name_the_field(kwargs, field):
    from compiled_llm import EngineArgs

    with pytest.raises(ValueError, match=field):
        EngineArgs(enable_lora=True, **kwargs)


def test_vllm_lora_settings_that_change_nothing_are_taken():
    """vLLM's fully_sharded_loras (how TP ranks split adapters) and lora_dtype auto, or the
    model's dtype, as a vLLM user passes them (a torch.dtype too)."""
    import torch

    from compiled_llm import EngineArgs

    EngineArgs(enable_lora=True, fully_sharded_loras=True, lora_dtype="auto")
    EngineArgs(enable_lora=True, dtype="bfloat16", lora_dtype=torch.bfloat16)


@pytest.mark.parametrize("name", ["gemma", "gemma2", "gemma3", "olmo2", "granite", "cohere",
                                  "olmo", "olmo3"])
def test_an_adapter_of_another_architecture_matches_peft_merged(name):
    """The same projections under other layer shapes (Gemma 1-3: (1 + weight) norms, a GELU
    MLP; Gemma 2 and 3: norms after attention and around the MLP, Gemma 2's soft-capped
    scores, Gemma 3's q/k norms; OLMo 2: post-norms; Granite: scaled outputs; Cohere:
    attention and MLP in parallel off a LayerNorm, per-head q/k norms, interleaved RoPE;
    OLMo 1: weightless LayerNorms, clamped q/k/v; OLMo 3: OLMo 2's with a sliding layer)."""
    base = make_checkpoint(name)
    adapter = make_adapter(base, 1, rank=4)
    with LLM(str(base), enable_lora=True, max_lora_rank=4, dtype="float32",
             enforce_eager=True) as llm:
        assert _run(llm, PROMPTS, _lora(1, adapter)) == merged_greedy(base, adapter, PROMPTS, 6)


def test_lora_is_refused_where_it_cannot_apply():
    from compiled_llm import EngineArgs
    from compiled_llm.engine.pooling_engine import check_pooling_args

    with pytest.raises(ValueError, match="enable_lora"):
        check_pooling_args(EngineArgs(enable_lora=True, runner="pooling"))
    with pytest.raises(ValueError, match="enable_lora: mixture-of-experts"):
        LLM(str(make_checkpoint("qwen3_moe")), enable_lora=True, enforce_eager=True)
    with pytest.raises(ValueError, match="enable_lora: Phi3ForCausalLM has no module"):
        LLM(str(make_checkpoint("phi3")), enable_lora=True, enforce_eager=True)
    with pytest.raises(ValueError, match="enable_lora: GPTJForCausalLM has no module"):
        LLM(str(make_checkpoint("gptj")), enable_lora=True, enforce_eager=True)
    with pytest.raises(ValueError, match="enable_lora: mixture-of-experts"):
        LLM(str(make_checkpoint("granitemoe")), enable_lora=True, enforce_eager=True)
    with pytest.raises(ValueError, match="enable_lora: mixture-of-experts"):
        LLM(str(make_checkpoint("olmoe")), enable_lora=True, enforce_eager=True)


def test_engine_adds_lists_and_removes_adapters(llm, base, adapters):
    engine = llm.llm_engine
    added = LoRARequest("runtime", 60, str(adapters[2]))
    assert 60 not in engine.list_loras()
    assert engine.add_lora(added) is True and engine.add_lora(added) is True  # again: no-op
    assert 60 in engine.list_loras()
    with pytest.raises(NotImplementedError, match="pin_lora"):  # refused, not a silent no-op
        engine.pin_lora(60)
    want = [merged_greedy(base, adapters[2], PROMPTS[:1], 6)[0],
            merged_greedy(base, None, PROMPTS[1:2], 6)[0]]
    assert want[0] != merged_greedy(base, None, PROMPTS[:1], 6)[0]  # the adapter matters
    assert _run(llm, PROMPTS[:2], [added, None]) == want
    assert engine.remove_lora(60) is True and engine.remove_lora(60) is False
    assert 60 not in engine.list_loras()
    # the removed id names its adapter alone: another is refused, by add_lora and by requests
    other = LoRARequest("other", 60, str(adapters[1]))
    for use in (lambda: llm.generate([{"prompt_token_ids": PROMPTS[0]}], GREEDY,
                                     use_tqdm=False, lora_request=other),
                lambda: engine.add_lora(other)):
        with pytest.raises(ValueError, match="lora_int_id 60 already names"):
            use()
    assert 60 not in engine.list_loras()
    assert not engine.has_unfinished_requests() and engine.num_used_blocks == 0
    # a request naming the removed adapter adds it back (vLLM's), as add_lora does
    assert _run(llm, PROMPTS[:2], [added, None]) == want and 60 in engine.list_loras()
    assert engine.remove_lora(60) and engine.add_lora(added) and 60 in engine.list_loras()


@pytest.mark.parametrize("case", ["missing", "damaged", "config", "rank", "none", "id_taken"])
def test_add_lora_refuses_a_bad_adapter_by_field(llm, base, adapters, case):
    engine = llm.llm_engine
    engine.add_lora(_lora(1, adapters[0]))  # for id_taken: id 1 names adapters[0]
    lora, field = {
        "missing": (lambda: _lora(50, "/nonexistent/adapter"), "lora_path"),
        "damaged": (lambda: _lora(51, _damaged(adapters[0])), "lora_path"),
        "config": (lambda: _lora(52, with_config(adapters[0], target_modules=5)),
                   "target_modules"),
        "rank": (lambda: _lora(53, make_adapter(base, 10, rank=32)), "max_lora_rank"),
        "none": (lambda: None, "lora_request"),
        "id_taken": (lambda: _lora(1, adapters[1]), "lora_int_id"),
    }[case]
    before = engine.list_loras()
    with pytest.raises(ValueError, match=field):
        engine.add_lora(lora())
    assert engine.list_loras() == before
    assert _run(llm, PROMPTS[:1], [_lora(2, adapters[1])]) == merged_greedy(
        base, adapters[1], PROMPTS[:1], 6)


def test_async_llm_adds_and_removes_adapters(base, adapters):
    import asyncio

    from compiled_llm.config import EngineArgs
    from compiled_llm.entrypoints.async_llm import AsyncLLM

    engine = AsyncLLM(EngineArgs(model=str(base), enable_lora=True, max_loras=2,
                                 max_lora_rank=16, enforce_eager=True, dtype="float32"))
    lora = LoRARequest("async", 7, str(adapters[0]))

    async def main():
        assert await engine.add_lora(lora) is True and await engine.list_loras() == {7}
        with pytest.raises(NotImplementedError, match="pin_lora"):
            await engine.pin_lora(7)
        with pytest.raises(ValueError, match="lora_path"):
            await engine.add_lora(_lora(8, "/nonexistent/adapter"))
        outs = [o async for o in engine.generate({"prompt_token_ids": PROMPTS[0]}, GREEDY,
                                                 "a0", lora_request=lora)]
        assert await engine.remove_lora(7) is True and await engine.list_loras() == set()
        with pytest.raises(ValueError, match="lora_int_id 7"):  # another adapter under 7
            await engine.add_request("a1", {"prompt_token_ids": PROMPTS[0]}, GREEDY,
                                     lora_request=_lora(7, adapters[1]))
        return list(outs[-1].outputs[0].token_ids)

    try:
        assert asyncio.run(main()) == merged_greedy(base, adapters[0], PROMPTS[:1], 6)[0]
    finally:
        engine.shutdown()
