"""The transformers peers of the GPU benchmarks, each run in its own process (benchmarks.isolate):
continuous batching (offline throughput), static-cache generate with torch.compile (decode), and
one forward with SDPA attention (prefill). Greedy, EOS disabled, random-weight checkpoints."""

from __future__ import annotations

import time

import torch

from benchmarks.common import random_ids, sync


def load(model_dir: str, dtype: str):
    """The checkpoint as a transformers model with SDPA attention, on the device, eval mode."""
    import transformers

    # straight onto the GPU: loading 16 GB to host memory first costs more than the benchmark
    place = {"device_map": "cuda"} if torch.cuda.is_available() else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa", **place)
    return model.eval()


# ---------------------------------------------------------------- continuous batching
def continuous_batching(model_dir: str, dtype: str, prompts: list[list[int]], outs: list[int],
                        max_seconds: float, api: str = "manager") -> dict:
    """Output tokens/s of transformers' continuous batching on the workload.

    api="manager": the manager behind generate_batch, each request with its own max_new_tokens
    (the exact workload), streamed; past max_seconds the rest is cancelled and the tokens made
    so far count. api="generate_batch": one call with max_new_tokens = max(outs) for all; only
    the requested tokens of each request count (its set-up and warm-up are inside the time)."""
    from transformers import GenerationConfig

    model = load(model_dir, dtype)
    cfg = GenerationConfig(max_new_tokens=max(outs), do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    kw = _cpu_cache_config(prompts, outs)
    if api == "generate_batch":
        sync()
        t0 = time.perf_counter()
        res = model.generate_batch(inputs=prompts, generation_config=cfg, **kw)
        secs = time.perf_counter() - t0
        made = [len(r.generated_tokens) for r in res.values()]
        tokens = sum(min(m, o) for m, o in zip(made, outs))
        return {"api": api, "output_tokens": tokens, "generated_tokens": sum(made),
                "seconds": secs, "finished": len(res), "capped": False}
    with model.continuous_batching_context_manager(generation_config=cfg, block=True, **kw) as man:
        got, secs = _stream(man, prompts, outs, max_seconds)
    tokens = sum(min(got.get(f"r{i}", (0, False))[0], o) for i, o in enumerate(outs))
    finished = sum(done for _, done in got.values())
    return {"api": api, "output_tokens": tokens, "generated_tokens": tokens, "seconds": secs,
            "finished": finished, "capped": finished < len(prompts)}


def _cpu_cache_config(prompts, outs) -> dict:
    """On CPU, a KV pool just big enough for the workload: sized from host memory by default,
    its set-up alone takes many seconds. On CUDA transformers sizes it itself."""
    if torch.cuda.is_available():
        return {}
    from transformers import ContinuousBatchingConfig

    blocks = sum(-(-(len(p) + o) // 256) for p, o in zip(prompts, outs)) + 4
    return {"continuous_batching_config": ContinuousBatchingConfig(num_blocks=blocks,
                                                                   max_batch_tokens=512)}


def _stream(man, prompts, outs, max_seconds: float) -> tuple[dict, float]:
    """Submit every request, follow the streamed outputs until all finish or time runs out;
    {request id: (tokens so far, finished)} and the seconds taken."""
    sync()
    t0 = time.perf_counter()
    for i, (p, o) in enumerate(zip(prompts, outs)):
        man.add_request(input_ids=p, request_id=f"r{i}", max_new_tokens=o, streaming=True)
    got: dict[str, tuple[int, bool]] = {}
    finished = 0
    while finished < len(prompts) and time.perf_counter() - t0 < max_seconds:
        r = man.get_result(timeout=0.5)
        if r is None:
            if not man.is_running():
                raise RuntimeError("transformers' generation loop stopped")
            continue
        if r.error:
            raise RuntimeError(f"transformers request {r.request_id}: {r.error}")
        done = _is_done(r)
        got[r.request_id] = (len(r.generated_tokens), done)
        finished += done
    secs = time.perf_counter() - t0
    for i in range(len(prompts)):
        if not got.get(f"r{i}", (0, False))[1]:
            man.cancel_request(f"r{i}")
    return got, secs


def _is_done(out) -> bool:
    """A finished GenerationOutput (is_finished() where this transformers has it)."""
    fn = getattr(out, "is_finished", None)
    return fn() if callable(fn) else out.status.name in ("FINISHED", "FAILED")


# ---------------------------------------------------------------- static cache + compile
class StepClock:
    """A logits processor that only stamps each decode step: a CUDA event (no sync) or, on
    CPU, perf_counter. Mark i follows the forward that produced token i."""

    def __init__(self) -> None:
        self.marks: list = []

    def __call__(self, input_ids, scores):
        if scores.is_cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())
        return scores

    def seconds(self, first: int) -> float:
        """Time from mark `first` to the last mark."""
        a, b = self.marks[first], self.marks[-1]
        if isinstance(a, float):
            return b - a
        b.synchronize()
        return a.elapsed_time(b) / 1e3


def static_model(model_dir: str, dtype: str, compile_mode: str):
    """transformers with a static KV cache, and unless compile_mode is "none" generate's own
    compile of the decode step (reduce-overhead CUDA graphs, full graph), as its docs advise."""
    from transformers import CompileConfig

    model = load(model_dir, dtype)
    cfg = model.generation_config
    cfg.cache_implementation = "static"
    cfg.disable_compile = compile_mode == "none"
    cfg.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    cfg.eos_token_id = None
    cfg.pad_token_id = 0
    return model


def static_decode_run(model, batch: int, prompt_len: int, new_tokens: int, skip: int = 4) -> dict:
    """Decode tokens/s at `batch` after a warm-up generate of the same shapes; the first `skip`
    decode steps of the timed call are left out: each generate makes a new static cache, and
    CUDA-graph trees warm up and re-record on its new addresses in the first steps."""
    from transformers import LogitsProcessorList

    ids = torch.tensor(random_ids(batch, prompt_len, model.config.vocab_size, seed=batch),
                       device=model.device)
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
              do_sample=False)
    with torch.inference_mode():
        model.generate(**kw)
        clock = StepClock()
        out = model.generate(**kw, logits_processor=LogitsProcessorList([clock]))
    made = out.shape[1] - prompt_len
    if made != new_tokens:
        raise RuntimeError(f"transformers made {made} tokens, not {new_tokens}")
    steps = len(clock.marks) - 1 - skip
    secs = clock.seconds(skip)
    return {"batch": batch, "tok_s": batch * steps / secs, "ms_per_step": 1e3 * secs / steps}


def static_decode(model_dir: str, dtype: str, compile_mode: str, batch_sizes: list[int],
                  prompt_len: int, new_tokens: int, budget_s: float = 1e9) -> dict:
    """static_decode_run at each batch size in order; once budget_s has passed since the
    model was loaded, the remaining sizes are skipped and listed. A size that fails (out of
    memory, a compile error) is listed with its error and the next one is tried."""
    t0 = time.perf_counter()
    model = static_model(model_dir, dtype, compile_mode)
    rows, skipped, failed = [], [], {}
    for b in batch_sizes:
        if time.perf_counter() - t0 > budget_s:
            skipped.append(b)
            continue
        try:
            rows.append(static_decode_run(model, b, prompt_len, new_tokens))
        except Exception as e:  # keep the sizes measured so far
            failed[b] = f"{type(e).__name__}: {e}"[:300]
            print(f"transformers static decode, batch {b}: {failed[b]}", flush=True)
            continue
        print(f"transformers static decode: {rows[-1]}", flush=True)
    return {"rows": rows, "skipped": skipped, "failed": failed,
            "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------- prefill
def prefill(model_dir: str, dtype: str, lengths: list[int], reps: int = 3) -> dict:
    """Seconds of one forward over a single prompt of each length (best of reps after a
    warm-up); logits for the last token only, no KV cache kept."""
    model = load(model_dir, dtype)
    rows = []
    for n in lengths:
        ids = torch.tensor(random_ids(1, n, model.config.vocab_size, seed=n), device=model.device)
        best = float("inf")
        with torch.inference_mode():
            for i in range(reps + 1):
                sync()
                t = time.perf_counter()
                model(input_ids=ids, logits_to_keep=1, use_cache=False)
                sync()
                best = min(best, time.perf_counter() - t) if i else best
        rows.append({"length": n, "seconds": best})
    return {"rows": rows}
