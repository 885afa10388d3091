"""compiled-llm's side of the GPU benchmarks, each run in its own process (benchmarks.isolate):
offline generate, timed decode windows at fixed batch sizes (with the engine's step timer), and
single-prompt prefill. Greedy, ignore_eos, prefix caching off, no tokenizer."""

from __future__ import annotations

import time

from benchmarks.common import random_ids, sync


def make_llm(model_dir: str, dtype: str, compile_mode: str, cudagraph_mode: str, **kw):
    """An LLM; compile_mode "none" means eager (and no CUDA graphs). kw go to LLM (e.g.
    async_scheduling)."""
    from compiled_llm import LLM

    mode = {"enforce_eager": True} if compile_mode == "none" else {
        "compile_mode": compile_mode, "cudagraph_mode": cudagraph_mode}
    # in-process core: the decode windows drive engine.step and read the executor's model
    kw.setdefault("engine_core_process", False)
    return LLM(model_dir, dtype=dtype, skip_tokenizer_init=True, enable_prefix_caching=False,
               seed=0, **mode, **kw)


def weight_bytes(llm) -> int:
    """Bytes of every parameter of the loaded model (a tied embedding counted once)."""
    model = llm.engine.executor.worker.runner.model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def offline(model_dir: str, dtype: str, compile_mode: str, cudagraph_mode: str,
            prompts: list[list[int]], outs: list[int], max_model_len: int,
            async_scheduling: bool = False, engine_kw: dict | None = None) -> dict:
    """All requests through LLM.generate after a small warm-up; output tokens and seconds.
    engine_kw: more LLM arguments (tensor_parallel_size, say)."""
    from compiled_llm import SamplingParams

    t0 = time.perf_counter()
    llm = make_llm(model_dir, dtype, compile_mode, cudagraph_mode, max_model_len=max_model_len,
                   max_num_seqs=min(256, len(prompts)), async_scheduling=async_scheduling,
                   **(engine_kw or {}))
    startup = time.perf_counter() - t0
    params = [SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True) for o in outs]
    warm = [{"prompt_token_ids": p[:64]} for p in prompts[:8]]
    llm.generate(warm, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                 use_tqdm=False)
    before = llm.engine.step_stats
    sync()
    t = time.perf_counter()
    res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    secs = time.perf_counter() - t
    made = sum(len(r.outputs[0].token_ids) for r in res)
    if made != sum(outs) or llm.engine.num_used_blocks:
        raise RuntimeError(f"made {made} of {sum(outs)} tokens; "
                           f"{llm.engine.num_used_blocks} blocks still held")
    stats = (llm.engine.step_stats - before)
    return {"output_tokens": made, "seconds": secs, "startup_s": startup,
            "steps": stats.steps, **stats.per_step_ms()}


def decode_window(engine, batch: int, prompt_len: int, new_tokens: int, tag: str) -> dict:
    """`batch` requests of `prompt_len` random tokens; once every one has its first token, time
    the steps until all have made `new_tokens` more. Tokens/s counts tokens made in the window."""
    from compiled_llm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens + 1, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    reqs = [f"{tag}-{i}" for i in range(batch)]
    for rid, p in zip(reqs, random_ids(batch, prompt_len, vocab, seed=batch)):
        engine.add_request(rid, {"prompt_token_ids": p}, params)
    started: set[str] = set()
    while len(started) < batch:
        started.update(o.request_id for o in engine.step())
    # a request of a large batch can finish before the last one starts (short windows)
    before = sum(engine.parents[r][0].num_output_tokens if r in engine.parents
                 else new_tokens + 1 for r in reqs)
    stats0 = engine.step_stats
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    secs = time.perf_counter() - t
    stats = engine.step_stats - stats0
    if engine.num_used_blocks:
        raise RuntimeError(f"{engine.num_used_blocks} KV blocks still held after decode")
    tokens = batch * (new_tokens + 1) - before
    # per token of one request: under async scheduling the window's first step was launched
    # before it began, so stats.steps is one less than the tokens each request made
    return {"batch": batch, "tok_s": tokens / secs, "ms_per_step": 1e3 * secs * batch / tokens,
            "steps": stats.steps, **stats.per_step_ms()}


def decode(model_dir: str, dtype: str, compile_mode: str, cudagraph_mode: str,
           batch_sizes: list[int], prompt_len: int, new_tokens: int,
           async_scheduling: bool = False, passes: dict | None = None,
           engine_kw: dict | None = None) -> dict:
    """One engine, a decode window per batch size (each after a short warm-up window);
    `passes` overrides PassConfig fields, engine_kw are further LLM arguments."""
    t0 = time.perf_counter()
    llm = make_llm(model_dir, dtype, compile_mode, cudagraph_mode,
                   max_model_len=prompt_len + new_tokens + 32, max_num_seqs=max(batch_sizes),
                   async_scheduling=async_scheduling, **({"passes": passes} if passes else {}),
                   **(engine_kw or {}))
    startup = time.perf_counter() - t0
    rows = []
    for b in batch_sizes:
        decode_window(llm.engine, b, prompt_len, 4, f"warm{b}")
        rows.append(decode_window(llm.engine, b, prompt_len, new_tokens, f"b{b}"))
        graphs = "eager" if compile_mode == "none" else f"graphs {cudagraph_mode}"
        graphs += ", async" if async_scheduling else ""
        print(f"compiled-llm decode ({compile_mode}, {graphs}): {rows[-1]}",
              flush=True)
    return {"rows": rows, "startup_s": startup, "weight_bytes": weight_bytes(llm),
            "kv_blocks": llm.engine.executor.num_blocks}


def prefill(model_dir: str, dtype: str, compile_mode: str, cudagraph_mode: str,
            lengths: list[int], reps: int = 3) -> dict:
    """Seconds to prefill one prompt of each length and sample its first token (one step:
    max_num_batched_tokens covers the longest prompt); best of reps after a warm-up."""
    from compiled_llm import SamplingParams

    longest = max(lengths)
    llm = make_llm(model_dir, dtype, compile_mode, cudagraph_mode, max_model_len=longest + 16,
                   max_num_batched_tokens=longest, max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    vocab = llm.engine.model_config.vocab_size
    rows = []
    for n in lengths:
        prompt = {"prompt_token_ids": random_ids(1, n, vocab, seed=n)[0]}
        best = float("inf")
        for i in range(reps + 1):
            sync()
            t = time.perf_counter()
            llm.generate(prompt, params, use_tqdm=False)
            best = min(best, time.perf_counter() - t) if i else best
        rows.append({"length": n, "seconds": best})
    return {"rows": rows}
