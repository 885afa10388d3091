"""The offline API where vLLM's has more: LLM.chat's template arguments, methods refused,
llm_engine, vLLM's exported names, SamplingParams.bad_words / truncate_prompt_tokens /
extra_args, RequestOutput.num_cached_tokens, a prompt's cache_salt, and prompt dict keys a
text-only engine refuses (and sampling_params that are no SamplingParams)."""

from __future__ import annotations

import asyncio
import re

import pytest
from tqdm import tqdm

import compiled_llm
from compiled_llm import LLM, EngineArgs, SamplingParams, TextPrompt, TokensPrompt
from tests.utils import ForceTokens, make_chatml_checkpoint

BOS, IM_START = 1, 3
HI = [{"role": "user", "content": "hi"}]
ONE = SamplingParams(temperature=0.0, max_tokens=1)


@pytest.fixture(scope="module")
def llm():
    engine = LLM(make_chatml_checkpoint(), enforce_eager=True, dtype="float32", device="cpu",
                 block_size=16)
    yield engine
    assert not engine.engine.has_unfinished_requests()
    assert engine.engine.num_used_blocks == 0


def _prompt(llm, messages=HI, **kw) -> str:
    return llm.chat(messages, ONE, use_tqdm=False, **kw)[0].prompt


# ----------------------------------------------------------------------------- LLM.chat
def test_chat_passes_tools_and_template_kwargs_to_the_template(llm):
    template = ("{% if tools %}TOOLS={{ tools | map(attribute='function.name') | join(',') }};"
                "{% endif %}{% if enable_thinking is defined and not enable_thinking %}NOTHINK;"
                "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert _prompt(llm, chat_template=template) == "hi"
    assert _prompt(llm, chat_template=template, tools=tools) == "TOOLS=f;hi"
    assert _prompt(llm, chat_template=template,
                   chat_template_kwargs={"enable_thinking": False}) == "NOTHINK;hi"
    # an LLM.chat argument given in chat_template_kwargs wins, as in vLLM
    assert _prompt(llm, chat_template_kwargs={"add_generation_prompt": False}) \
        == "<|im_start|>user\nhi<|im_end|>\n"


def test_chat_continues_the_final_message(llm):
    messages = [*HI, {"role": "assistant", "content": "Sure, the"}]
    text = _prompt(llm, messages, continue_final_message=True, add_generation_prompt=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure, the"
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(messages, ONE, use_tqdm=False, continue_final_message=True)


def test_chat_adds_special_tokens_only_when_asked(llm):
    plain = llm.chat(HI, ONE, use_tqdm=False)[0].prompt_token_ids
    added = llm.chat(HI, ONE, use_tqdm=False, add_special_tokens=True)[0].prompt_token_ids
    assert plain[0] == IM_START  # the template's own opening, no BOS
    assert added == [BOS, *plain]


def test_chat_content_format_string_or_openai_parts(llm):
    template = ("{% for m in messages %}{% if m['content'] is string %}S:{{ m['content'] }}"
                "{% else %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endif %}"
                "{% endfor %}")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]
    for fmt in ("auto", "string"):
        assert _prompt(llm, parts, chat_template=template,
                       chat_template_content_format=fmt) == "S:a\nb"
    assert _prompt(llm, parts, chat_template=template,
                   chat_template_content_format="openai") == "[a][b]"
    assert _prompt(llm, chat_template=template, chat_template_content_format="openai") == "[hi]"
    # auto on a template that reads only parts (vLLM's detection): each part its own
    parts_only = "{% for m in messages %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}"
    assert _prompt(llm, parts, chat_template=parts_only + "{% endfor %}") == "[a][b]"
    assert _prompt(llm, chat_template=parts_only + "{% endfor %}") == "[hi]"
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(HI, ONE, use_tqdm=False, chat_template_content_format="xml")
    image = [{"role": "user", "content": [{"type": "text", "text": "a"}, {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[1\]: image_url content"):
        llm.chat(image, ONE, use_tqdm=False)


def test_chat_refuses_multimodal_processor_kwargs(llm):
    with pytest.raises(ValueError, match="mm_processor_kwargs"):
        llm.chat(HI, ONE, use_tqdm=False, mm_processor_kwargs={"num_crops": 4})


# ----------------------------------------------------------------------------- names
def test_llm_engine_is_the_engine(llm):
    assert llm.llm_engine is llm.engine


@pytest.mark.parametrize("method, args", [("sleep", ()), ("wake_up", ()),
                                          ("collective_rpc", ("echo",)),
                                          ("apply_model", (len,)), ("set_tokenizer", (None,)),
                                          ("start_profile", ()), ("stop_profile", ())])
def test_vllm_methods_this_engine_lacks_are_refused_by_name(llm, method, args):
    with pytest.raises(NotImplementedError, match=f"{method}\\(\\) is not supported"):
        getattr(llm, method)(*args)


def test_use_tqdm_takes_the_callable_that_makes_the_bar(llm):
    made = []

    def make_bar(**kwargs):
        made.append(kwargs)
        return tqdm(**kwargs, disable=True)

    llm.generate(["one", "two"], ONE, use_tqdm=make_bar)
    assert len(made) == 1 and made[0]["total"] == 2
    with pytest.raises(TypeError):  # the options after sampling_params are keyword-only
        llm.generate(["one"], ONE, True, None)


def test_progress_bar_shows_vllm_token_speeds(llm):
    import io

    stream = io.StringIO()
    llm.generate(["one", "two"], ONE, use_tqdm=lambda **kw: tqdm(**kw, file=stream))
    assert "2/2" in stream.getvalue()
    assert re.search(r"est\. speed input: [\d.]+ toks/s, output: [\d.]+ toks/s",
                     stream.getvalue())


def test_vllm_engine_values_that_change_nothing_here(tmp_path):
    """seed=None is seed 0 (vLLM's); swap_space, max_seq_len_to_capture and
    disable_custom_all_reduce are accepted; cpu_offload_gb above 0 is refused by name."""
    args = EngineArgs(seed=None, swap_space=8, max_seq_len_to_capture=8192,
                      disable_custom_all_reduce=True, cpu_offload_gb=0)
    assert args.seed == 0
    with pytest.raises(ValueError, match="cpu_offload_gb"):
        EngineArgs(cpu_offload_gb=2)
    with pytest.raises(ValueError, match="seed"):
        EngineArgs(seed="7")


def test_reset_prefix_cache_and_the_engines_tokenizer(llm):
    llm.generate(["hello there, hello there"], ONE, use_tqdm=False)
    assert llm.reset_prefix_cache() is True
    again = llm.generate(["hello there, hello there"], ONE, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0
    assert llm.llm_engine.get_tokenizer() is llm.get_tokenizer()


def test_legacy_prompt_token_ids_keyword(llm):
    ids = [[5, 6, 7], [8, 9]]
    outs = llm.generate(sampling_params=ONE, prompt_token_ids=ids, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == ids and outs[0].prompt is None
    one = llm.generate("abc", ONE, prompt_token_ids=[5, 6, 7], use_tqdm=False)
    assert one[0].prompt == "abc" and one[0].prompt_token_ids == [5, 6, 7]
    assert one[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate(["a", "b"], ONE, prompt_token_ids=[5, 6], use_tqdm=False)


@pytest.mark.parametrize("params", [{"max_tokens": 1}, [ONE, {"max_tokens": 1}], 5])
def test_sampling_params_of_another_type_are_refused_by_name(llm, params):
    with pytest.raises(ValueError, match=r"^sampling_params"):
        llm.generate(["a", "b"], params, use_tqdm=False)
    assert llm.engine.num_used_blocks == 0 and not llm.engine.has_unfinished_requests()
    assert llm.generate("a", ONE, use_tqdm=False)[0].outputs[0].token_ids


def test_vllm_names_are_exported(llm):
    for name in ("TextPrompt", "TokensPrompt", "PromptType", "PoolingParams",
                 "PoolingRequestOutput", "EmbeddingRequestOutput", "AsyncEngineArgs"):
        assert name in compiled_llm.__all__ and getattr(compiled_llm, name) is not None
    assert issubclass(compiled_llm.AsyncEngineArgs, compiled_llm.EngineArgs)
    assert hasattr(compiled_llm.AsyncLLM, "from_engine_args")
    assert "AsyncLLMEngine" in compiled_llm.__all__  # vLLM's V1 alias of AsyncLLM
    assert compiled_llm.AsyncLLMEngine is compiled_llm.AsyncLLM
    with pytest.raises(ValueError, match="start_engine_loop"):
        compiled_llm.AsyncLLM.from_engine_args(compiled_llm.EngineArgs(),
                                               start_engine_loop=False)
    text, tokens = TextPrompt(prompt="hi"), TokensPrompt(prompt_token_ids=[5, 6, 7])
    outs = llm.generate([text, tokens], ONE, use_tqdm=False)
    assert outs[0].prompt == "hi" and outs[1].prompt_token_ids == [5, 6, 7]


# ----------------------------------------------------------------------------- prompt keys
@pytest.mark.parametrize("extra", ["multi_modal_data", "mm_processor_kwargs", "prompt_embeds",
                                   "bogus"])
def test_a_prompt_key_the_engine_does_not_read_is_refused_by_name(llm, extra):
    with pytest.raises(ValueError, match=f"'{extra}' is not supported"):
        llm.generate(["fine", {"prompt": "hi", extra: {}}], ONE, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # the good prompt was withdrawn too


# ----------------------------------------------------------------------------- SamplingParams
def _ids(llm, word: str) -> list[int]:
    return llm.get_tokenizer().encode(word, add_special_tokens=False)


def _forced(llm, ids: list[int], **kw) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=len(ids), ignore_eos=True,
                            logits_processors=[ForceTokens(ids)], **kw)
    return llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)[0] \
        .outputs[0].token_ids


def test_bad_words_ban_a_word_with_and_without_a_leading_space(llm):
    bare, spaced = _ids(llm, "I"), _ids(llm, " I")
    assert len(bare) == len(spaced) == 1 and bare != spaced  # two one-token forms
    for ids in (bare, spaced):
        assert _forced(llm, ids) == ids
        assert _forced(llm, ids, bad_words=["I"]) != ids


def test_bad_words_ban_the_last_token_only_after_the_rest(llm):
    (t, he), (space_t, he_too) = _ids(llm, "the"), _ids(llm, " the")
    assert he == he_too and t != space_t  # "the" and " the": two two-token forms
    for first in (t, space_t):
        assert _forced(llm, [first, he]) == [first, he]
        banned = _forced(llm, [first, he], bad_words=["the"])
        assert banned[0] == first and banned[1] != he
    assert _forced(llm, [he, he], bad_words=["the"]) == [he, he]  # no prefix: allowed


def test_bad_words_are_checked(llm):
    for bad in ("fox", [""], ["  "], [3]):
        with pytest.raises(ValueError, match="bad_words"):
            SamplingParams(bad_words=bad)


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    out = llm.generate({"prompt_token_ids": list(range(5, 25))},
                       SamplingParams(temperature=0.0, max_tokens=1, truncate_prompt_tokens=4),
                       use_tqdm=False)[0]
    assert out.prompt_token_ids == [21, 22, 23, 24]
    long = list(range(5, 200)) * 4  # past max_model_len
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": long}, ONE, use_tqdm=False)
    out = llm.generate({"prompt_token_ids": long},
                       SamplingParams(temperature=0.0, max_tokens=1, truncate_prompt_tokens=-1),
                       use_tqdm=False)[0]
    assert out.prompt_token_ids == long[-(llm.engine.max_model_len - 1):]
    past = SamplingParams(max_tokens=1, truncate_prompt_tokens=llm.engine.max_model_len + 1)
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):  # vLLM's, even if short
        llm.generate({"prompt_token_ids": [5, 6, 7]}, past, use_tqdm=False)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            SamplingParams(truncate_prompt_tokens=bad)


def test_truncate_prompt_tokens_keeps_a_text_prompts_bos(llm):
    """A text prompt is cut as vLLM's left-truncating tokenizer cuts it: the BOS it adds
    stays first, `k` tokens in all; token ids are cut plainly (above)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(llm.engine.args.model,
                                                     truncation_side="left")
    text = "The quick brown fox jumps over the lazy dog. " * 3
    for k in (1, 2, 5):
        params = SamplingParams(temperature=0.0, max_tokens=1, truncate_prompt_tokens=k)
        vllm_ids = tok(text, truncation=True, max_length=k).input_ids
        assert vllm_ids[0] == BOS and len(vllm_ids) == k
        for prompt in (text, TextPrompt(prompt=text)):
            got = llm.generate(prompt, params, use_tqdm=False)[0].prompt_token_ids
            assert got == vllm_ids


def test_async_llm_cuts_a_text_prompt_as_llm_does(llm):
    import transformers

    from compiled_llm.config import EngineArgs
    from compiled_llm.entrypoints.async_llm import AsyncLLM

    tok = transformers.AutoTokenizer.from_pretrained(llm.engine.args.model,
                                                     truncation_side="left")
    text = "The quick brown fox jumps over the lazy dog."
    engine = AsyncLLM(EngineArgs(model=llm.engine.args.model, enforce_eager=True,
                                 dtype="float32", device="cpu", engine_core_process=False))
    params = SamplingParams(temperature=0.0, max_tokens=1, truncate_prompt_tokens=3)

    async def prompt_ids() -> list[int]:
        outs = [out async for out in engine.generate(text, params, "cut")]
        return outs[-1].prompt_token_ids

    try:
        assert asyncio.run(prompt_ids()) == tok(text, truncation=True, max_length=3).input_ids
    finally:
        engine.shutdown()


def test_extra_args_are_carried_and_checked(llm):
    with_args = SamplingParams(temperature=0.0, max_tokens=3, extra_args={"tag": [1, 2]})
    plain = SamplingParams(temperature=0.0, max_tokens=3)
    got = llm.generate("hello", [with_args], use_tqdm=False)[0].outputs[0].token_ids
    assert got == llm.generate("hello", plain, use_tqdm=False)[0].outputs[0].token_ids
    assert with_args.clone().extra_args == {"tag": [1, 2]}
    with pytest.raises(ValueError, match="extra_args"):
        SamplingParams(extra_args=["tag"])
    with pytest.raises(ValueError, match="extra_args must be picklable"):
        llm.generate("hello", SamplingParams(extra_args={"f": lambda: 0}), use_tqdm=False)


# ----------------------------------------------------------------------------- prefix cache
def test_num_cached_tokens_counts_prefix_cache_hits(llm):
    llm.engine.reset_prefix_cache()
    prompt = {"prompt_token_ids": list(range(40, 80))}  # 40 tokens: 2 full blocks of 16
    first = llm.generate(prompt, ONE, use_tqdm=False)[0]
    again = llm.generate([prompt, prompt], ONE, use_tqdm=False)
    assert first.num_cached_tokens == 0
    assert [o.num_cached_tokens for o in again] == [32, 32]
    scored = llm.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)[0]
    assert scored.num_cached_tokens == 0  # prompt logprobs recompute the prompt


def test_cache_salt_isolates_prefix_cache_blocks(llm):
    llm.engine.reset_prefix_cache()
    ids = list(range(40, 80))  # 40 tokens: 2 full blocks of 16

    def cached(**salt) -> int:
        prompt = {"prompt_token_ids": ids, **salt}
        return llm.generate(prompt, ONE, use_tqdm=False)[0].num_cached_tokens

    assert cached(cache_salt="A") == 0
    assert cached(cache_salt="A") == 32  # the same salt shares the blocks
    assert cached(cache_salt="B") == 0  # another salt never does
    assert cached() == 0  # nor does no salt
    assert cached() == 32
    text = {"prompt": "The quick brown fox jumps over the lazy dog. " * 3, "cache_salt": "A"}
    first, again = (llm.generate(text, ONE, use_tqdm=False)[0] for _ in range(2))
    assert first.num_cached_tokens == 0 and again.num_cached_tokens > 0
    assert llm.engine.num_used_blocks == 0


@pytest.mark.parametrize("salt", ["", 5, ["A"]])
def test_a_bad_cache_salt_is_refused_by_name(llm, salt):
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string"):
        llm.generate(["fine", {"prompt": "hi", "cache_salt": salt}], ONE, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
